"""Every snippet in the README and docs/ runs, and runs again: python blocks and runnable shell blocks, page by page
in order, then the page once more over what its first run left (a reader runs a page twice), with the pages'
scratch folder /tmp/x moved into the test's temporary folder.

The python snippets run in one interpreter for the whole module (tests/snippet_runner.py), each in a namespace of
its own; shell snippets in a shell each, their `fivefold` calls and the ranks their `torchrun` calls start answered
by a warm interpreter (tests/warm_python.py: the start-up is most of a CLI call's time, and of a rank's). Either kind
is killed with its process group when it hangs."""

import json
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import warm_python
from launching import end

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Set-up and test commands, placeholders, and the demo (the main job of the set-up: test_package runs it once,
# with the checks of its table; here it would run four times over, a third of this file's time).
NOT_RUN = ("pip install", "scripts/test.sh", "pytest", "ruff ", "path/to", "fivefold demo")
TIMEOUT_S = 600


def snippets(page: Path) -> list[tuple[str, str]]:
    found = re.findall(r"```(\w+)\n(.*?)```", page.read_text(), re.S)
    return [(lang, code) for lang, code in found if lang in ("python", "bash") and not any(s in code for s in NOT_RUN)]


def environment() -> dict:
    # The `fivefold` command of the environment running the tests, also from a virtualenv that is not activated.
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


class Runner:
    """The python snippets' interpreter, started again after a snippet that hung or killed it."""

    def __init__(self):
        self.process = None

    def run(self, code: str, cwd: Path) -> tuple[bool, str]:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).parent / "snippet_runner.py")],
                env=environment(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        self.process.stdin.write(json.dumps({"code": code, "cwd": str(cwd)}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            return False, f"no answer within {TIMEOUT_S} s (a hang, or the interpreter died)"
        answer = json.loads(line)
        return answer["ok"], answer["error"]

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None


@pytest.fixture(scope="module")
def runner():
    interpreter = Runner()
    yield interpreter
    interpreter.close()


@pytest.fixture(scope="module")
def shell_environment(tmp_path_factory):
    """The shell snippets' environment: `fivefold` and `torchrun` on their PATH run through tests/warm_python.py,
    whose server was started with this very environment (a call in any other runs a real interpreter). One OpenMP
    thread a process, as the pages' multi-process snippets ask of their ranks (the thread count is read once, at
    the server's imports)."""
    shims = tmp_path_factory.mktemp("warm-python")
    env = environment()
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    env["OMP_NUM_THREADS"] = "1"
    warm_python.write_shims(str(shims), warm_python.start(env))
    return env


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_snippets_run_twice_in_a_row(page, tmp_path, runner, shell_environment):
    scratch = str(tmp_path / "x")
    for attempt in ("first", "second"):
        for i, (lang, code) in enumerate(snippets(page)):
            code = code.replace("/tmp/x", scratch)
            if lang == "python":
                ok, error = runner.run(code, tmp_path)
            else:
                returncode, error = run_in_own_group(["bash", "-e", "-c", code], tmp_path, shell_environment)
                ok = returncode == 0
            assert ok, f"{page.name} snippet {i} ({lang}), {attempt} run, failed:\n{code}\n{error[-3000:]}"


def run_in_own_group(command: list[str], cwd: Path, env: dict, timeout: float = TIMEOUT_S) -> tuple[int, str]:
    """A snippet in a process group of its own, so that a hang is ended whole and fails the test rather than holding
    the pipes open: SIGTERM first, so that a torchrun in it stops its ranks (they run in sessions of their own, out
    of the group's reach), SIGKILL after (launching.end)."""
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end([process])
        process.communicate()
        pytest.fail(f"snippet timed out after {timeout} s (a hang): {command[-1][:200]}")
    return process.returncode, stderr
