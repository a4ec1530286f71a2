"""Every benchmark script runs in its --quick mode and prints a markdown report, so that none rots unnoticed."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
NOT_TIMED = ("harness.py", "charts.py")  # the shared helpers, and the script that draws the docs charts
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.name not in NOT_TIMED)
TIMEOUT_S = 180  # a --quick run takes seconds; this only catches a hang


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_quick_mode_prints_a_table(script, tmp_path):
    out, data = tmp_path / "report.md", tmp_path / "report.json"
    process = subprocess.Popen(
        [sys.executable, str(script), "--quick", "--out", str(out), "--json", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        start_new_session=True,  # its own process group, so that a hang is killed with the children it started
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"{script.name} --quick ran longer than {TIMEOUT_S} s")
    assert process.returncode == 0, stderr[-3000:]
    assert re.search(r"^\| .+ \|\n\|(---\|)+\n\| .+ \|$", stdout, re.M), stdout
    assert out.read_text() == stdout
    report = json.loads(data.read_text())
    tables = report["tables"]
    assert tables and all(table["rows"] for table in tables)
    assert all({"architecture", "benchmark", "stock", "fivefold"} <= result.keys() for result in report["results"])
    assert any(isinstance(value, float) for table in tables for row in table["rows"] for value in row.values())
