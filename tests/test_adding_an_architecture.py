"""docs/adding-an-architecture.md, followed: its three files written into a copy of the package and its name added
to the table, then the demo and the table-driven tests run on the copy, where they cover the new architecture
(DistilBERT) with nothing else edited."""

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "adding-an-architecture.md"
# pyproject.toml's package-dir: folder -> where it sits in an importable `fivefold` tree.
FOLDERS = {"fivefold": "fivefold", "configuration": "fivefold/configuration", "modeling": "fivefold/modeling",
           "conversion": "fivefold/conversion"}  # fmt: skip
# The tests that run over every registered architecture.
TABLE_DRIVEN = [
    "test_parity.py",
    "test_meta.py",
    "test_roundtrip.py",
    "test_remote_code.py",
    "test_bad_inputs.py",
    "test_bad_checkpoints.py",
    "test_properties.py",
    "test_unpadding.py",
]


def follow_the_page(tree: Path) -> list[str]:
    """Writes the package into `tree` as an importable folder, then the page's files and its table edit; returns
    the paths the page wrote."""
    for folder, place in FOLDERS.items():
        shutil.copytree(ROOT / folder, tree / place, ignore=shutil.ignore_patterns("__pycache__"))
    text = PAGE.read_text(encoding="utf-8")
    written = []
    for path, code in re.findall(r"```python (\S+)\n(.*?)```", text, re.S):
        folder, _, name = path.partition("/")
        target = tree / FOLDERS[folder] / name
        assert not target.exists(), f"the page overwrites {path}"
        target.write_text(code, encoding="utf-8")
        written.append(path)
    table = re.search(r"```diff fivefold/architectures\.py\n-(.*?)\n\+(.*?)\n```", text, re.S)
    old, new = table.groups()
    architectures = tree / "fivefold" / "architectures.py"
    source = architectures.read_text(encoding="utf-8")
    assert source.count(old) == 1, "the page's table edit no longer matches fivefold/architectures.py"
    architectures.write_text(source.replace(old, new), encoding="utf-8")
    return written


def run(command: list[str], tree: Path, cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the whole group: a hang fails the test, not CI
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, out)


@pytest.mark.slow
def test_following_the_page_adds_a_working_architecture(tmp_path):
    tree = tmp_path / "tree"
    written = follow_the_page(tree)
    assert written == ["configuration/distilbert.py", "modeling/distilbert.py", "conversion/distilbert.py"]
    assert len((tree / "fivefold/modeling/distilbert.py").read_text().splitlines()) <= 200

    demo = run([sys.executable, "-m", "fivefold", "demo", "distilbert"], tree, tmp_path, timeout=600)
    assert demo.returncode == 0, demo.stdout[-3000:]
    rows = [line for line in demo.stdout.splitlines() if line.startswith("distilbert ")]
    assert len(rows) == 6 and all(row.endswith("yes") for row in rows), demo.stdout[-3000:]

    shutil.copytree(ROOT / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    tests = [f"tests/{name}" for name in TABLE_DRIVEN]
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "distilbert", *tests]
    result = run(pytest_run, tree, tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", result.stdout)[1])
    assert passed >= 60, result.stdout[-2000:]  # every class of the new architecture, in every table-driven test
