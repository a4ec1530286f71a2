"""convert -> export is lossless for every class of every architecture in the table; sharded checkpoints, a dtype
on the way, and converting an export again. (Random configs: test_properties.py.)"""

import json

import pytest
import torch
import transformers
from safetensors import safe_open

import fivefold
from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.verify import verify
from fivefold.modeling.expert_store import read_header

from helpers import read_tensors

CLASSES = [pytest.param(arch, cls, id=cls.__name__) for arch in ARCHITECTURES for cls in arch.models.values()]


@pytest.mark.parametrize(("arch", "cls"), CLASSES)
def test_export_restores_stock_checkpoint(converted, tmp_path, arch, cls):
    stock_name = stock_class_name(cls)
    src, dst = converted(arch.stock_model_type, stock_name)
    # The converted folder holds our model's tensors under our names, each tied copy at most once.
    converted_names, ours = set(read_tensors(dst)), cls.from_pretrained(dst).eval()
    assert converted_names <= set(ours.state_dict())
    assert set(ours.state_dict()) - converted_names <= set(ours.all_tied_weights_keys)

    out = fivefold.export(dst, tmp_path / "stock-again", progress=False)
    original, exported = read_tensors(src), read_tensors(out)
    assert set(original) == set(exported)
    assert all(torch.equal(original[k], exported[k]) for k in original)
    # Each tensor where safetensors put it (stock computes on the mapped weights, and alignment steers its kernels).
    assert _alignments(out) == _alignments(src)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == arch.stock_model_type and config["architectures"] == [stock_name]
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    again = getattr(transformers, stock_name).from_pretrained(out).eval()
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    with torch.no_grad():
        assert torch.equal(stock(**inputs)[0], again(**inputs)[0])


def _alignments(folder) -> dict[str, int]:
    headers = [read_header(file) for file in folder.glob("*.safetensors")]
    return {name: entry.offset % 64 for header in headers for name, entry in header.items()}


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
