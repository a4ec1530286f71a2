"""A converted or saved checkpoint loads with stock transformers and trust_remote_code=True in a process that
cannot import fivefold, and gives the same logits."""

import json
import subprocess
import sys
import textwrap

import torch
import transformers

import fivefold
from fivefold.conversion.inputs import text_inputs

REMOTE_LOAD = textwrap.dedent(
    """
    import importlib.abc, json, sys
    sys.path = [p for p in sys.path if p not in ("", ".") and "fivefold" not in p and not p.endswith("/main")]

    class NoFivefold(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "fivefold":
                raise ImportError("fivefold is not importable in this process")

    sys.meta_path.insert(0, NoFivefold())
    import torch, transformers
    transformers.utils.logging.set_verbosity_error()
    folder, auto_name, inputs_file, out_file = sys.argv[1:5]
    model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
    assert "fivefold" not in sys.modules
    inputs = torch.load(inputs_file)
    with torch.no_grad():
        out = model(**inputs)
    torch.save({"cls": type(model).__name__, "module": type(model).__module__, "logits": out[0]}, out_file)
    """
)


def _remote_logits(tmp_path, folder, auto_name, inputs):
    torch.save(inputs, tmp_path / "inputs.pt")
    script = tmp_path / "remote_load.py"
    script.write_text(REMOTE_LOAD)
    result = subprocess.run(
        [sys.executable, str(script), str(folder), auto_name, str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(tmp_path / "out.pt")


def test_converted_masked_lm_loads_as_remote_code(converted, tmp_path):
    src, dst = converted("bert", "BertForMaskedLM")
    config = json.loads((dst / "config.json").read_text())
    assert config["model_type"] == "fivefold_bert"
    expected_autos = {"AutoConfig", "AutoModel", "AutoModelForMaskedLM", "AutoModelForPreTraining",
                      "AutoModelForNextSentencePrediction", "AutoModelForSequenceClassification",
                      "AutoModelForTokenClassification", "AutoModelForQuestionAnswering",
                      "AutoModelForMultipleChoice"}  # fmt: skip
    assert set(config["auto_map"]) == expected_autos
    shipped = sorted(p.name for p in dst.glob("*.py"))
    assert "modeling_bert.py" in shipped and "configuration_bert.py" in shipped
    for file in dst.glob("*.py"):  # flat, one-level relative imports, no fivefold imports at top level
        text = file.read_text()
        assert "from .." not in text and "from . import" not in text
        assert not any(line.startswith(("import fivefold", "from fivefold")) for line in text.splitlines())

    stock = transformers.BertForMaskedLM.from_pretrained(src).eval()
    inputs = text_inputs(stock.config)
    remote = _remote_logits(tmp_path, dst, "AutoModelForMaskedLM", inputs)
    assert remote["cls"] == "FivefoldBertForMaskedLM" and remote["module"].startswith("transformers_modules.")
    with torch.no_grad():
        expected = stock(**inputs).logits
    assert (remote["logits"] - expected)[inputs["attention_mask"].bool()].abs().max() <= 1e-4  # padding excluded


def test_save_pretrained_ships_code_and_our_names(converted, tmp_path):
    _, dst = converted("roberta", "RobertaForSequenceClassification")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(dst).eval()
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    from safetensors import safe_open

    keys = set(safe_open(str(saved / "model.safetensors"), "pt").keys())
    assert "model.layers.0.attn.q_proj.weight" in keys and not any(k.startswith("roberta.") for k in keys)
    assert json.loads((saved / "config.json").read_text())["auto_map"]["AutoModelForSequenceClassification"] == (
        "modeling_roberta.FivefoldRobertaForSequenceClassification"
    )
    inputs = text_inputs(model.config)
    remote = _remote_logits(tmp_path, saved, "AutoModelForSequenceClassification", inputs)
    with torch.no_grad():
        assert (remote["logits"] - model(**inputs).logits).abs().max() <= 1e-5
    assert fivefold.FivefoldRobertaForSequenceClassification.from_pretrained(saved) is not None


def test_push_to_hub_uploads_our_names_and_the_code(converted, monkeypatch):
    """push_to_hub() goes through our save_pretrained: fivefold tensor names and the flat code are uploaded.
    (The Hub itself is mocked here; the loopback Hub round trip comes later.)"""
    from types import SimpleNamespace

    from safetensors import safe_open
    from transformers.utils import hub

    uploaded = {}

    def fake_upload(self, folder, repo_id, **kwargs):
        from pathlib import Path

        folder = Path(folder)
        uploaded["files"] = sorted(p.name for p in folder.iterdir())
        uploaded["keys"] = set(safe_open(str(folder / "model.safetensors"), "pt").keys())
        uploaded["config"] = json.loads((folder / "config.json").read_text())

    api = SimpleNamespace(create_repo=lambda repo_id, **kw: SimpleNamespace(repo_id=repo_id))
    monkeypatch.setattr(hub, "hf_api", lambda: api)
    monkeypatch.setattr(hub, "create_and_tag_model_card", lambda *a, **k: SimpleNamespace(save=lambda path: None))
    monkeypatch.setattr(hub.PushToHubMixin, "_upload_modified_files", fake_upload)

    _, dst = converted("bert", "BertForTokenClassification")
    transformers.AutoModelForTokenClassification.from_pretrained(dst).push_to_hub("someone/tiny-fivefold-bert")
    assert "modeling_bert.py" in uploaded["files"] and "configuration_bert.py" in uploaded["files"]
    assert "model.layers.0.attn.q_proj.weight" in uploaded["keys"]
    assert not any(k.startswith("bert.") for k in uploaded["keys"])
    assert uploaded["config"]["auto_map"]["AutoModelForTokenClassification"].startswith("modeling_bert.")
