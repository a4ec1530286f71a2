"""The docs site builds with `mkdocs build --strict` (every page in the navigation, no broken link or reference,
the API reference collected from the docstrings), and the benchmark chart is drawn from results in JSON."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_charts():
    spec = importlib.util.spec_from_file_location("charts", ROOT / "benchmarks" / "charts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_mkdocs_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "masked_lm_collator" in api and "PackedSequences" in api  # docstrings were collected
    for page in ("examples", "benchmarks", "pretraining"):
        assert (tmp_path / "site" / page / "index.html").is_file()


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f" {page.name}" in nav for page in (ROOT / "docs").glob("*.md"))


def test_benchmark_chart_from_json(tmp_path):
    charts = load_charts()
    results = {
        "machine": "test",
        "results": [
            {"architecture": "BERT", "benchmark": "a", "higher_is_better": True, "stock": 10, "fivefold": 20},
            {"architecture": "T5", "benchmark": "b", "higher_is_better": False, "stock": 30, "fivefold": 10,
             "onnxruntime": 15},
        ],
    }  # fmt: skip
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert charts.speedup(results["results"][0], "fivefold") == 2.0
    assert charts.speedup(results["results"][1], "fivefold") == 3.0  # times: stock / fivefold
    assert charts.speedup(results["results"][0], "onnxruntime") is None
    chart = charts.main([str(path), "--out", str(tmp_path / "charts")])
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    del results["results"][0]["stock"]
    path.write_text(json.dumps(results))
    with pytest.raises(ValueError, match="lacks \\['stock'\\]"):
        charts.main([str(path), "--out", str(tmp_path / "charts")])


def test_the_committed_chart_input_reads():
    """The results the docs' chart is drawn from, as the benchmark scripts wrote them."""
    charted = [ROOT / "benchmarks" / "results" / f"{name}.json" for name in ("encoders", "gpt2", "t5", "vit")]
    results, _ = load_charts().read(charted)
    assert {r["architecture"] for r in results} == {"BERT", "RoBERTa", "ModernBERT", "GPT-2", "T5", "ViT"}
    assert any("onnxruntime" in r for r in results)
