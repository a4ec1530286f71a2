"""Every snippet in the README and docs/ runs: python blocks and runnable shell blocks, page by page in order,
with the pages' scratch folder /tmp/x moved into the test's temporary folder."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = ("pip install", "pytest", "ruff ", "path/to")  # set-up commands, the test command, placeholders


def snippets(page: Path) -> list[tuple[str, str]]:
    found = re.findall(r"```(\w+)\n(.*?)```", page.read_text(), re.S)
    return [(lang, code) for lang, code in found if lang in ("python", "bash") and not any(s in code for s in NOT_RUN)]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_snippets_run(page, tmp_path):
    scratch = str(tmp_path / "x")
    # The `fivefold` command of the environment running the tests, also from a virtualenv that is not activated.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for i, (lang, code) in enumerate(snippets(page)):
        code = code.replace("/tmp/x", scratch)
        command = [sys.executable, "-c", code] if lang == "python" else ["bash", "-e", "-c", code]
        returncode, stderr = run_in_own_group(command, tmp_path, env)
        assert returncode == 0, f"{page.name} snippet {i} ({lang}) failed:\n{code}\n{stderr[-3000:]}"


def run_in_own_group(command: list[str], cwd: Path, env: dict, timeout: float = 600) -> tuple[int, str]:
    """A snippet in a process group of its own, so that a hang (a launcher's ranks included) is killed whole and fails
    the test rather than holding the pipes open."""
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"snippet timed out after {timeout} s (a hang): {command[-1][:200]}")
    return process.returncode, stderr
