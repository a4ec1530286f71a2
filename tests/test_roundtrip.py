"""convert -> export is lossless; every input layout the converter accepts."""

import json

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import fivefold
from fivefold.conversion.inputs import text_inputs
from fivefold.conversion.verify import verify


def _tensors(folder):
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


@pytest.mark.parametrize(
    ("model_type", "stock_name"),
    [("bert", "BertForPreTraining"), ("bert", "BertModel"), ("roberta", "RobertaForMaskedLM")],
)
def test_export_restores_stock_checkpoint(converted, tmp_path, model_type, stock_name):
    src, dst = converted(model_type, stock_name)
    out = fivefold.export(dst, tmp_path / "stock-again", progress=False)
    original, exported = _tensors(src), _tensors(out)
    assert set(original) == set(exported)
    assert all(torch.equal(original[k], exported[k]) for k in original)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model_type and config["architectures"] == [stock_name]
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    again = getattr(transformers, stock_name).from_pretrained(out).eval()
    inputs = text_inputs(stock.config)
    with torch.no_grad():
        a, b = stock(**inputs), again(**inputs)
    assert torch.equal(a[0], b[0])


def test_sharded_dtype_and_reconvert(converted, tmp_path):
    src, _ = converted("bert", "BertForMaskedLM")
    sharded = fivefold.convert(src, tmp_path / "sharded", max_shard_size="20KB", progress=False)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert max(verify(src, sharded).values()) <= 1e-4
    # a sharded stock checkpoint converts too
    stock_sharded = fivefold.export(sharded, tmp_path / "stock-sharded", max_shard_size="20KB", progress=False)
    assert (stock_sharded / "model.safetensors.index.json").is_file()
    again = fivefold.convert(stock_sharded, tmp_path / "again", progress=False)
    assert max(verify(src, again).values()) <= 1e-4

    half = fivefold.convert(src, tmp_path / "bf16", dtype="bfloat16", progress=False)
    with safe_open(str(half / "model.safetensors"), "pt") as f:
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"


def test_legacy_bin_without_prefix_and_gamma_beta(converted, tmp_path):
    """An old-style pytorch_model.bin: no `bert.` prefix on encoder tensors, LayerNorm.gamma/beta, position_ids."""
    src, _ = converted("bert", "BertForMaskedLM")
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    state = {}
    for key, value in _tensors(src).items():
        key = key.removeprefix("bert.").replace("LayerNorm.weight", "LayerNorm.gamma")
        state[key.replace("LayerNorm.bias", "LayerNorm.beta")] = value
    state["embeddings.position_ids"] = torch.arange(64)[None]
    torch.save(state, legacy / "pytorch_model.bin")
    (legacy / "config.json").write_text((src / "config.json").read_text())
    dst = fivefold.convert(legacy, tmp_path / "converted", progress=False)
    assert max(verify(src, dst).values()) <= 1e-4


def test_untied_decoder_is_kept(converted, tmp_path):
    """A checkpoint whose stored decoder differs from the embeddings loads untied, as in stock."""
    src, _ = converted("bert", "BertForMaskedLM")
    untied = tmp_path / "untied"
    untied.mkdir()
    tensors = _tensors(src)
    tensors["cls.predictions.decoder.weight"] = torch.randn_like(tensors["bert.embeddings.word_embeddings.weight"])
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"].clone()  # untied saves store both
    save_file(tensors, untied / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    dst = fivefold.convert(untied, tmp_path / "converted", progress=False)
    assert json.loads((dst / "config.json").read_text())["tie_word_embeddings"] is False
    assert max(verify(untied, dst).values()) <= 1e-4
