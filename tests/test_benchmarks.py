"""Every benchmark script runs in its --quick mode and prints a markdown report, so that none rots unnoticed.

The scripts run one after another in one fresh interpreter (each as `python benchmarks/<name>.py --quick ...`
would run it, its own argv and `__main__`), killed with its process group when it hangs: the start-up of torch and
transformers is paid once, not once a script. The processes a script starts itself (loading processes, torchrun's
ranks) run through a warm interpreter (tests/warm_python.py, named by `FIVEFOLD_BENCHMARK_PYTHON`), which skips
their start-up too: they run in the memory cgroups the scripts make, but the memory they report is not a fresh
process's (not checked here). One OpenMP thread a process, as torchrun gives its ranks (a rank's environment must
be the server's to be served warm).
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import warm_python

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
NOT_TIMED = ("harness.py", "cgroup.py", "charts.py")  # the shared helpers, and the script drawing the docs charts
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.name not in NOT_TIMED)
TIMEOUT_S = 1800  # every --quick run together takes minutes; this only catches a hang

DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, runpy, sys, time, traceback
    from pathlib import Path
    benchmarks, folder = Path(sys.argv[1]), Path(sys.argv[2])
    sys.path.insert(0, str(benchmarks))  # what `python benchmarks/<name>.py` puts first: harness.py
    for name in sys.argv[3:]:
        out, printed, error, start = folder / name, io.StringIO(), "", time.perf_counter()
        out.mkdir()
        sys.argv = [str(benchmarks / f"{name}.py"), "--quick", "--out", str(out / "report.md"), "--json",
                    str(out / "report.json")]
        try:
            with contextlib.redirect_stdout(printed):
                runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as stop:
            error = "" if stop.code in (None, 0) else f"SystemExit({stop.code!r})"
        except BaseException:
            error = traceback.format_exc()
        seconds = time.perf_counter() - start
        (out / "result.json").write_text(json.dumps({"stdout": printed.getvalue(), "error": error, "seconds": seconds}))
    """
)


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory) -> Path:
    folder, shims = tmp_path_factory.mktemp("benchmarks"), tmp_path_factory.mktemp("warm-python")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["FIVEFOLD_BENCHMARK_PYTHON"] = str(shims / "python")
    warm = warm_python.start(env)
    warm_python.write_shims(str(shims), warm, names=("python",))
    command = [sys.executable, "-c", DRIVER, str(BENCHMARKS), str(folder), *(p.stem for p in SCRIPTS)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=folder,
        env=env,
        start_new_session=True,  # its own process group, so that a hang is killed with the children it started
    )
    try:
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        stderr = f"the --quick runs took longer than {TIMEOUT_S} s (a hang)\n{stderr}"
    warm_python.close(warm)
    (folder / "stderr.txt").write_text(stderr)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_quick_mode_prints_a_table(script, quick_runs):
    result_file = quick_runs / script.stem / "result.json"
    assert result_file.exists(), f"{script.name} did not finish:\n{(quick_runs / 'stderr.txt').read_text()[-3000:]}"
    run = json.loads(result_file.read_text())
    # The scripts' children (torchrun's ranks) write to the driver's stderr: a failure shows its end too.
    assert not run["error"], run["error"][-3000:] + "\n--- stderr:\n" + (quick_runs / "stderr.txt").read_text()[-3000:]
    out, data, stdout = (
        quick_runs / script.stem / "report.md",
        quick_runs / script.stem / "report.json",
        run["stdout"],
    )
    assert re.search(r"^\| .+ \|\n\|(---\|)+\n\| .+ \|$", stdout, re.M), stdout
    assert out.read_text() == stdout
    report = json.loads(data.read_text())
    tables = report["tables"]
    assert tables and all(table["rows"] for table in tables)
    assert all({"architecture", "benchmark", "stock", "fivefold"} <= result.keys() for result in report["results"])
    assert any(isinstance(value, float) for table in tables for row in table["rows"] for value in row.values())


def test_the_gpu_script_parses():
    """benchmarks/gpu.sh runs only where a GPU is lent: here its bash and every Python program in it must parse."""
    script = BENCHMARKS / "gpu.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    programs = re.findall(r"python - <<'PY'[^\n]*\n(.*?)\nPY\n", script.read_text(), re.S)
    assert len(programs) == 2
    for program in programs:
        compile(program, str(script), "exec")
