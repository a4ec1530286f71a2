"""Bad checkpoints and bad requests: one clear error naming the key or file, a non-zero exit, DST untouched."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import fivefold
from fivefold import ConversionError


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite_tensors(folder, change):
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "fivefold", *map(str, args)], capture_output=True, text=True)


@pytest.fixture
def bert_src(stock_checkpoint, tmp_path):
    return _copy(stock_checkpoint("bert", "BertForMaskedLM"), tmp_path / "src")


def _assert_fails(src, dst, *needles):
    with pytest.raises(ConversionError) as err:
        fivefold.convert(src, dst, progress=False)
    for needle in needles:
        assert needle in str(err.value)
    assert not dst.exists()
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.tmp")]  # no temp folder left
    result = _cli("convert", src, dst)
    assert result.returncode == 2
    assert all(needle in result.stderr for needle in needles), result.stderr
    assert "Traceback" not in result.stderr
    assert not dst.exists()


def test_missing_tensor(bert_src, tmp_path):
    _rewrite_tensors(bert_src, lambda t: t.pop("bert.encoder.layer.1.attention.self.query.weight"))
    _assert_fails(bert_src, tmp_path / "dst", "missing", "bert.encoder.layer.1.attention.self.query.weight")


def test_wrong_shape(bert_src, tmp_path):
    def shrink(t):
        t["bert.encoder.layer.0.intermediate.dense.weight"] = torch.zeros(36, 32)

    _rewrite_tensors(bert_src, shrink)
    _assert_fails(bert_src, tmp_path / "dst", "bert.encoder.layer.0.intermediate.dense.weight", "[36, 32]", "[37, 32]")


def test_unknown_tensor(bert_src, tmp_path):
    _rewrite_tensors(bert_src, lambda t: t.__setitem__("bert.encoder.layer.0.adapter.weight", torch.zeros(2)))
    _assert_fails(bert_src, tmp_path / "dst", "bert.encoder.layer.0.adapter.weight")


@pytest.mark.parametrize(
    ("extra", "shape"),
    [
        ("bert.encoder.layer.0.attention.self.query.lora_A.weight", (4, 32)),  # under a known module
        ("bert.encoder.layer.2.attention.self.query.weight", (32, 32)),  # a layer the config does not have
        ("classifier.weight", (7, 5)),  # another head's tensor, of a shape no head has
    ],
)
def test_tensor_without_a_place_is_refused(bert_src, tmp_path, extra, shape):
    _rewrite_tensors(bert_src, lambda t: t.__setitem__(extra, torch.zeros(shape)))
    _assert_fails(bert_src, tmp_path / "dst", extra)


def test_export_checks_the_fivefold_checkpoint(converted, tmp_path):
    _, dst = converted("bert", "BertForMaskedLM")
    broken = _copy(dst, tmp_path / "broken")
    _rewrite_tensors(broken, lambda t: t.pop("model.layers.1.attn.q_proj.weight"))
    with pytest.raises(ConversionError, match=r"missing .*model\.layers\.1\.attn\.q_proj\.weight"):
        fivefold.export(broken, tmp_path / "out", progress=False)
    broken = _copy(dst, tmp_path / "broken2")
    _rewrite_tensors(broken, lambda t: t.__setitem__("model.layers.0.attn.k_proj.weight", torch.zeros(5, 3)))
    with pytest.raises(ConversionError, match=r"\[5, 3\]"):
        fivefold.export(broken, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_unknown_model_type(bert_src, tmp_path):
    config = json.loads((bert_src / "config.json").read_text())
    (bert_src / "config.json").write_text(json.dumps({**config, "model_type": "xlnet"}))
    _assert_fails(bert_src, tmp_path / "dst", "xlnet", "config.json")


def test_config_not_json_or_without_model_type(bert_src, tmp_path):
    (bert_src / "config.json").write_text("{not json")
    _assert_fails(bert_src, tmp_path / "dst", "config.json", "not valid JSON")
    (bert_src / "config.json").write_text("{}")
    _assert_fails(bert_src, tmp_path / "dst", "config.json", "model_type")


def test_inconsistent_config(bert_src, tmp_path):
    config = json.loads((bert_src / "config.json").read_text())
    (bert_src / "config.json").write_text(json.dumps({**config, "num_attention_heads": 5}))
    _assert_fails(bert_src, tmp_path / "dst", "num_attention_heads", "hidden_size")


@pytest.mark.parametrize("shard_name", ["../outside.safetensors", "/etc/passwd", "link.safetensors"])
def test_shard_index_outside_folder(bert_src, tmp_path, shard_name):
    outside = tmp_path / "outside.safetensors"
    shutil.move(bert_src / "model.safetensors", outside)
    (bert_src / "link.safetensors").symlink_to(outside)
    keys = list(load_file(outside))
    index = {"metadata": {}, "weight_map": dict.fromkeys(keys, shard_name)}
    (bert_src / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_fails(bert_src, tmp_path / "dst", shard_name, "outside the checkpoint folder")


def test_missing_shard(bert_src, tmp_path):
    keys = list(load_file(bert_src / "model.safetensors"))
    (bert_src / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": dict.fromkeys(keys, "model-00001-of-00002.safetensors")}
    (bert_src / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_fails(bert_src, tmp_path / "dst", "model-00001-of-00002.safetensors", "does not exist")


def test_truncated_safetensors(bert_src, tmp_path):
    data = (bert_src / "model.safetensors").read_bytes()
    (bert_src / "model.safetensors").write_bytes(data[: len(data) // 2])
    _assert_fails(bert_src, tmp_path / "dst", "model.safetensors")


class _CreatesAFile:
    """Unpickling this would run `open(path, "w")`."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_pickle_that_runs_code_is_refused(bert_src, tmp_path, zip_format):
    marker = tmp_path / "pwned"
    (bert_src / "model.safetensors").unlink()
    payload = {"bert.embeddings.word_embeddings.weight": _CreatesAFile(marker)}
    torch.save(payload, bert_src / "pytorch_model.bin", _use_new_zipfile_serialization=zip_format)
    _assert_fails(bert_src, tmp_path / "dst", "pytorch_model.bin", "weights-only")
    assert not marker.exists()


def test_existing_destination_needs_force(stock_checkpoint, tmp_path):
    src = stock_checkpoint("bert", "BertForMaskedLM")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("old")
    with pytest.raises(ConversionError, match="already exists"):
        fivefold.convert(src, dst, progress=False)
    assert (dst / "keep.txt").read_text() == "old"
    assert _cli("convert", src, dst).returncode == 2
    assert _cli("convert", src, dst, "--force").returncode == 0
    assert not (dst / "keep.txt").exists() and (dst / "model.safetensors").is_file()


def test_failed_forced_conversion_keeps_old_destination(bert_src, stock_checkpoint, tmp_path):
    dst = fivefold.convert(stock_checkpoint("bert", "BertForMaskedLM"), tmp_path / "dst", progress=False)
    before = sorted(p.name for p in dst.iterdir())
    _rewrite_tensors(bert_src, lambda t: t.pop("bert.embeddings.word_embeddings.weight"))
    with pytest.raises(ConversionError):
        fivefold.convert(bert_src, dst, force=True, progress=False)
    assert sorted(p.name for p in dst.iterdir()) == before


def test_fivefold_checkpoint_is_not_converted_again(converted, tmp_path):
    _, dst = converted("bert", "BertForMaskedLM")
    with pytest.raises(ConversionError, match="already a fivefold checkpoint"):
        fivefold.convert(dst, tmp_path / "again", progress=False)
    with pytest.raises(ConversionError, match="not a fivefold one"):
        fivefold.export(converted("bert", "BertForMaskedLM")[0], tmp_path / "out", progress=False)


def test_unsupported_head_is_named(bert_src, tmp_path):
    config = json.loads((bert_src / "config.json").read_text())
    (bert_src / "config.json").write_text(json.dumps({**config, "architectures": ["BertLMHeadModel"]}))
    _assert_fails(bert_src, tmp_path / "dst", "BertLMHeadModel", "supported")


def test_verify_cli_prints_diffs(converted):
    src, dst = converted("roberta", "RobertaForMaskedLM")
    result = _cli("verify", src, dst)
    assert result.returncode == 0, result.stderr
    assert "logits" in result.stdout and "max abs diff" in result.stdout
