"""The README's set-up is two commands and CI runs exactly those; the second installs every extra of
pyproject.toml, so that a package added to an extra reaches the tests' environment."""

import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).parent.parent


def _commands(text: str) -> list[str]:
    """The command lines of a shell text: comments, blank lines, `set`, `cd` and `export` left out."""
    lines = (line.split(" #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith(("#", "set ", "cd ", "export "))]


def _readme_setup() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [cmd for block in re.findall(r"```bash\n(.*?)```", section, re.S) for cmd in _commands(block)]


def test_readme_setup_is_two_commands_and_ci_runs_exactly_them():
    setup = _readme_setup()
    assert len(setup) == 2, setup
    assert setup[0].startswith("pip install torch==2.13.0 ") and setup[0].endswith("&& fivefold demo")
    assert _commands((ROOT / ".ci" / "run").read_text()) == setup


def test_test_script_installs_every_extra():
    """The extras list the script computes is every key of [project.optional-dependencies]."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    program = script.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    out = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert out.strip().split(",") == list(extras)
    assert 'torch==2.13.0 -e ".[$extras]"' in script  # torch pinned in the same pip command
