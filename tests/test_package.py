"""The distribution: the wheel holds every subpackage under fivefold.*, the console script runs the demo."""

import subprocess
import sys
import zipfile
from pathlib import Path

import launching
import pytest

from fivefold.architectures import ARCHITECTURES
from fivefold.conversion.errors import ConversionError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_maps_the_top_level_folders(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = next(tmp_path.glob("fivefold-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("fivefold/__init__.py", "fivefold/cli.py", "fivefold/configuration/bert.py",
                   "fivefold/modeling/block.py", "fivefold/conversion/keymap.py"):  # fmt: skip
        assert module in names
    assert not any(n.startswith(("tests/", "modeling/")) for n in names)
    # the unpacked wheel imports on its own, away from the source tree
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = "import fivefold, fivefold.modeling as m; print(m.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(site)}
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(site))


@pytest.mark.slow
def test_demo_prints_a_parity_table():
    command = [*launching.warm(), "-m", "fivefold", "demo"]  # the start-up skipped (tests/launching.py)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=launching.environment())
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("bert") and "FivefoldBertForPreTraining" in line for line in lines)
    assert any(line.startswith("roberta") for line in lines)
    assert lines[-1].endswith("yes")


def test_demo_of_named_architectures_only(capsys):
    from fivefold.conversion.demo import run_demo

    assert run_demo(only=["gpt2"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("gpt2 ")]
    assert len(rows) == len(next(a for a in ARCHITECTURES if a.stock_model_type == "gpt2").models)
    with pytest.raises(ConversionError, match="no architecture gtp2 in the table; it has bert, "):
        run_demo(only=["gtp2"])
