"""Every example in examples/ runs end to end with --smoke (a few steps on a few examples) and writes its
results.json and PNG plots. The full runs and their figures are in examples/README.md."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NAMES = ["sentiment", "ner", "summarization", "images", "pretraining", "moe"]


def load(name: str):
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # the examples import their shared `common` module
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_example_smoke_run(name, tmp_path):
    example = load(name)
    common = sys.modules["common"]
    try:
        results = example.main(["--smoke", "--output-dir", str(tmp_path), "--threads", "2"])
    except common.MissingData as missing:
        if name != "images":  # pip-installable data (examples/get_data.sh) must be there; only apt's may not
            raise
        pytest.skip(f"Fashion-MNIST is not installed on this machine: {missing}")
    written = json.loads((tmp_path / "results.json").read_text())
    assert written == results and written["example"] == name and written["mode"] == "smoke"
    assert results["plots"]
    for plot in results["plots"]:
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
