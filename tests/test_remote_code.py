"""A converted or saved checkpoint loads with stock transformers and trust_remote_code=True in a process that
cannot import fivefold, for every class of every architecture in the table: the same outputs as stock, and for
classes that generate, stock's tokens."""

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

import fivefold
from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.inputs import text_inputs

from helpers import RemoteJob, generation_overrides, run_without_fivefold

GREEDY = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False)


def _shipped_file(cls: type) -> str:
    """The flat file a class's module ships as: fivefold.modeling.bert -> modeling_bert.py."""
    return "_".join(cls.__module__.split(".")[1:]) + ".py"


def _check_shipped_code(arch, folder: Path, cls: type) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == arch.model_type
    assert set(config["auto_map"]) == {"AutoConfig", *arch.auto_classes}
    shipped = {p.name for p in folder.glob("*.py")}
    assert {_shipped_file(arch.config_class), _shipped_file(cls)} <= shipped
    for file in folder.glob("*.py"):  # flat, one-level relative imports of shipped files, no fivefold imports
        text = file.read_text()
        lines = text.splitlines()
        assert "from .." not in text and "from . import" not in text
        assert not any(line.startswith(("import fivefold", "from fivefold")) for line in lines)
        imported = {line.split()[1].removeprefix(".") for line in lines if line.lstrip().startswith("from .")}
        assert {f"{name}.py" for name in imported} <= shipped, file.name


def _masked_max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None) -> float:
    """The largest absolute difference, at real tokens only where the outputs run along the mask ([B, T, ...])."""
    diff = (a.float() - b.float()).abs()
    if mask is not None and tuple(diff.shape[: mask.dim()]) == tuple(mask.shape):
        diff = diff[mask.bool()]
    return float(diff.max()) if diff.numel() else 0.0


def _flat_mask(inputs: dict) -> torch.Tensor | None:
    mask = inputs.get("attention_mask")
    return None if mask is None else mask.reshape(-1, mask.shape[-1])


def _jobs_and_checks(arch, converted) -> tuple[list[RemoteJob], list[tuple]]:
    """The remote jobs of every class of the architecture, and what each must give: stock's and fivefold's outputs
    in this process."""
    jobs, checks = [], []
    for auto_name, cls in arch.models.items():
        stock_name = stock_class_name(cls)
        src, dst = converted(arch.stock_model_type, stock_name)
        _check_shipped_code(arch, dst, cls)
        stock = getattr(transformers, stock_name).from_pretrained(src).eval()
        ours = cls.from_pretrained(dst).eval()
        inputs = arch.sample_inputs(stock.config, stock_name, 0)
        with torch.no_grad():
            expected, own = stock(**inputs), ours(**inputs)
        jobs.append(RemoteJob(dst, auto_name, inputs))
        checks.append((cls, inputs, expected, own))
        if cls.can_generate():
            src, dst = converted(arch.stock_model_type, stock_name, **generation_overrides(arch))
            stock, ours = getattr(transformers, stock_name).from_pretrained(src).eval(), cls.from_pretrained(dst).eval()
            prompt = {k: inputs[k] for k in ("input_ids", "attention_mask")}
            tokens = [{"sequences": model.generate(**prompt, **GREEDY)} for model in (stock, ours)]
            jobs.append(RemoteJob(dst, auto_name, prompt, GREEDY))
            checks.append((cls, prompt, *tokens))
    return jobs, checks


@pytest.fixture(scope="module")
def remote_runs(converted, tmp_path_factory, request) -> dict:
    """The jobs of every architecture whose test is selected (`-k distilbert` prepares one), in one process without
    fivefold (the start-up of torch and transformers paid once, not once an architecture): per architecture,
    (remote result, check) pairs, or the error its preparation raised (re-raised by its own test)."""
    chosen = {item.callspec.id for item in request.session.items if item.originalname == NAME}
    prepared, jobs = {}, []
    for arch in (a for a in ARCHITECTURES if a.stock_model_type in chosen):
        try:
            arch_jobs, checks = _jobs_and_checks(arch, converted)
        except Exception as error:  # its own test fails with it; the other architectures run
            prepared[arch.stock_model_type] = error
            continue
        prepared[arch.stock_model_type] = (len(jobs), checks)
        jobs += arch_jobs
    remote = run_without_fivefold(tmp_path_factory.mktemp("remote"), jobs)
    return {
        name: entry if isinstance(entry, Exception) else list(zip(remote[entry[0] :], entry[1], strict=False))
        for name, entry in prepared.items()
    }


NAME = "test_converted_folders_load_as_remote_code"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.stock_model_type)
def test_converted_folders_load_as_remote_code(arch, remote_runs):
    """Every class of the architecture without fivefold: outputs equal stock's within 1e-4 (our own code in this
    process within 1e-5) at real tokens; generate() gives stock's tokens, and fivefold's."""
    runs = remote_runs[arch.stock_model_type]
    if isinstance(runs, Exception):
        raise runs
    for remote, (cls, inputs, expected, own) in runs:
        assert remote["cls"] == cls.__name__ and remote["module"].startswith("transformers_modules.")
        outputs = remote["outputs"]
        if "sequences" in outputs:
            assert torch.equal(outputs["sequences"], expected["sequences"]), cls.__name__
            assert torch.equal(outputs["sequences"], own["sequences"]), cls.__name__
            continue
        first = next(iter(outputs))
        assert first in expected, (cls.__name__, first)
        mask = _flat_mask(inputs)
        for key, value in outputs.items():
            if key in expected and value.is_floating_point():
                assert _masked_max_diff(value, expected[key], mask) <= 1e-4, (cls.__name__, key)
                assert _masked_max_diff(value, own[key], mask) <= 1e-5, (cls.__name__, key)


@pytest.mark.slow
def test_save_pretrained_ships_code_and_our_names(converted, tmp_path):
    _, dst = converted("roberta", "RobertaForSequenceClassification")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(dst).eval()
    saved = tmp_path / "saved"
    model.save_pretrained(saved)

    keys = set(safe_open(str(saved / "model.safetensors"), "pt").keys())
    assert "model.layers.0.attn.q_proj.weight" in keys and not any(k.startswith("roberta.") for k in keys)
    assert json.loads((saved / "config.json").read_text())["auto_map"]["AutoModelForSequenceClassification"] == (
        "modeling_roberta.FivefoldRobertaForSequenceClassification"
    )
    inputs = text_inputs(model.config)
    (remote,) = run_without_fivefold(tmp_path, [RemoteJob(saved, "AutoModelForSequenceClassification", inputs)])
    with torch.no_grad():
        assert (remote["outputs"]["logits"] - model(**inputs).logits).abs().max() <= 1e-5
    assert fivefold.FivefoldRobertaForSequenceClassification.from_pretrained(saved) is not None


def test_push_to_hub_uploads_our_names_and_the_code(converted, monkeypatch):
    """push_to_hub() goes through our save_pretrained: fivefold tensor names and the flat code are uploaded.
    (The Hub itself is mocked here; the loopback Hub round trip comes later.)"""
    from types import SimpleNamespace

    from transformers.utils import hub

    uploaded = {}

    def fake_upload(self, folder, repo_id, **kwargs):
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
