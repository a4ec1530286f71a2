"""Bad checkpoints and bad requests: one clear error naming the key or file, a non-zero exit, DST untouched.
Rows common to every architecture run over fivefold.architectures.ARCHITECTURES."""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import warnings

import launching
import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors.torch import load_file, save_file

import fivefold
from fivefold import ConversionError, cli
from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.errors import CheckpointWarning


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite_tensors(folder, change):
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _cli(*args):
    """`python -m fivefold ARGS` in a process of its own (a child of the session's warm interpreter,
    tests/launching.py: the start-up is most of a CLI call's time)."""
    command = [*launching.warm(), "-m", "fivefold", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=launching.environment(), timeout=600)


def _cli_in_process(*args) -> tuple[int, str]:
    """The `fivefold` command in this process (seconds saved per case); two tests run it as a process of its own
    (`_cli`)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main([str(a) for a in args])
    return code, stderr.getvalue()


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
    code, stderr = _cli_in_process("convert", src, dst)
    assert code == 2
    assert all(needle in stderr for needle in needles), stderr
    assert "Traceback" not in stderr
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


@pytest.mark.slow
def test_cli_reports_errors_without_a_traceback(bert_src, tmp_path):
    (bert_src / "config.json").write_text("{not json")
    result = _cli("convert", bert_src, tmp_path / "dst")
    assert result.returncode == 2
    assert "config.json is not valid JSON" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "dst").exists()


def test_existing_destination_needs_force(stock_checkpoint, tmp_path):
    src = stock_checkpoint("bert", "BertForMaskedLM")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("old")
    with pytest.raises(ConversionError, match="already exists"):
        fivefold.convert(src, dst, progress=False)
    assert (dst / "keep.txt").read_text() == "old"
    assert _cli_in_process("convert", src, dst)[0] == 2
    assert _cli_in_process("convert", src, dst, "--force")[0] == 0
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


@pytest.mark.slow
def test_verify_cli_prints_diffs(converted):
    src, dst = converted("roberta", "RobertaForMaskedLM")
    result = _cli("verify", src, dst)
    assert result.returncode == 0, result.stderr
    assert "logits" in result.stdout and "max abs diff" in result.stdout


# --- rows every architecture shares: the stock base model's checkpoint, one weight matrix spoiled ------------


@pytest.fixture(params=ARCHITECTURES, ids=lambda a: a.stock_model_type)
def arch_src(request, stock_checkpoint, tmp_path):
    arch = request.param
    return arch, _copy(stock_checkpoint(arch.stock_model_type, stock_class_name(arch.base_model)), tmp_path / "src")


def _a_weight_matrix(folder) -> str:
    tensors = load_file(folder / "model.safetensors")
    return next(k for k in sorted(tensors) if tensors[k].dim() == 2 and tensors[k].is_floating_point())


def test_int_tensor_where_floats_belong(arch_src, tmp_path):
    _, src = arch_src
    key = _a_weight_matrix(src)
    _rewrite_tensors(src, lambda t: t.__setitem__(key, t[key].long()))
    _assert_fails(src, tmp_path / "dst", key, "torch.int64", "floating-point")


def test_wrong_shape_every_architecture(arch_src, tmp_path):
    _, src = arch_src
    key = _a_weight_matrix(src)
    shape = list(load_file(src / "model.safetensors")[key].shape)
    wrong = [shape[0] + 1, shape[1]]
    _rewrite_tensors(src, lambda t: t.__setitem__(key, torch.zeros(wrong)))
    _assert_fails(src, tmp_path / "dst", f"tensor '{key}' has shape {wrong}", "needs")


def test_missing_tensor_every_architecture(arch_src, tmp_path):
    _, src = arch_src
    key = _a_weight_matrix(src)
    _rewrite_tensors(src, lambda t: t.pop(key))
    _assert_fails(src, tmp_path / "dst", "missing", key)


def test_nan_and_inf_weights_warn_with_the_tensor_name(arch_src, tmp_path):
    arch, src = arch_src
    key = _a_weight_matrix(src)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # a clean checkpoint converts without a warning
        fivefold.convert(src, tmp_path / "clean", progress=False)

    def spoil(t):
        t[key][0, 0] = float("nan")
        t[key][0, 1] = float("inf")

    _rewrite_tensors(src, spoil)
    expected = f"tensor '{key}' in {src / 'model.safetensors'} holds 1 NaN and 1 infinite value"
    with pytest.warns(CheckpointWarning) as record:
        fivefold.convert(src, tmp_path / "dst", progress=False)
    assert [str(w.message) for w in record if expected in str(w.message)]
    code, stderr = _cli_in_process("convert", src, tmp_path / "dst-cli")
    assert code == 0 and f"fivefold convert: warning: {expected}" in stderr
    with pytest.warns(CheckpointWarning, match=f"'{key}'.* 1 NaN and 1 infinite"):  # the stock folder, loaded directly
        arch.base_model.from_pretrained(src)


# --- the reader: files, shards, formats --------------------------------------------------------------------


def test_duplicate_key_across_shards(bert_src, tmp_path):
    tensors = load_file(bert_src / "model.safetensors")
    keys = sorted(tensors)
    dup = keys[0]
    first = {k: tensors[k] for k in keys[: len(keys) // 2]}
    second = {k: tensors[k] for k in [*keys[len(keys) // 2 :], dup]}
    (bert_src / "model.safetensors").unlink()
    save_file(first, bert_src / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file(second, bert_src / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    weight_map = {
        **dict.fromkeys(first, "model-00001-of-00002.safetensors"),
        **dict.fromkeys(second, "model-00002-of-00002.safetensors"),
    }
    (bert_src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _assert_fails(bert_src, tmp_path / "dst", dup, "appears in both", "model-00001-of-00002.safetensors")


def _with_header(data: bytes, change) -> bytes:
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + size :]


def _first_tensor(header) -> str:
    return sorted(k for k in header if k != "__metadata__")[0]


CORRUPTIONS = {
    "empty": lambda data: b"",
    "shorter-than-header": lambda data: data[:4],
    "header-size-huge": lambda data: (2**60).to_bytes(8, "little") + data[8:],
    "header-not-json": lambda data: (
        data[:8] + b"x" * int.from_bytes(data[:8], "little") + data[8:][int.from_bytes(data[:8], "little") :]
    ),
    "data-truncated": lambda data: data[:-100],
    "offsets-past-end": lambda data: _with_header(
        data, lambda h: h[_first_tensor(h)].__setitem__("data_offsets", [0, 10**9])
    ),
    "shape-disagrees-with-bytes": lambda data: _with_header(
        data, lambda h: h[_first_tensor(h)].__setitem__("shape", [999])
    ),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_corrupted_safetensors(bert_src, tmp_path, corruption):
    path = bert_src / "model.safetensors"
    path.write_bytes(CORRUPTIONS[corruption](path.read_bytes()))
    _assert_fails(bert_src, tmp_path / "dst", "model.safetensors", "is not a readable safetensors file")


def test_bin_that_is_not_a_checkpoint(bert_src, tmp_path):
    (bert_src / "model.safetensors").unlink()
    (bert_src / "pytorch_model.bin").write_bytes(b"PK\x03\x04 this is not a torch archive")
    _assert_fails(bert_src, tmp_path / "dst", "pytorch_model.bin", "weights-only")


def test_pickle_payload_in_a_sharded_bin(bert_src, tmp_path):
    marker = tmp_path / "pwned"
    tensors = load_file(bert_src / "model.safetensors")
    (bert_src / "model.safetensors").unlink()
    torch.save(tensors, bert_src / "pytorch_model-00001-of-00002.bin")
    torch.save({"extra": _CreatesAFile(marker)}, bert_src / "pytorch_model-00002-of-00002.bin")
    weight_map = {
        **dict.fromkeys(tensors, "pytorch_model-00001-of-00002.bin"),
        "extra": "pytorch_model-00002-of-00002.bin",
    }
    (bert_src / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _assert_fails(bert_src, tmp_path / "dst", "pytorch_model-00002-of-00002.bin", "weights-only")
    assert not marker.exists()


def test_pickle_payload_refused_when_loading_a_stock_folder_directly(bert_src, tmp_path):
    marker = tmp_path / "pwned"
    (bert_src / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": _CreatesAFile(marker)}, bert_src / "pytorch_model.bin")
    for cls in (fivefold.FivefoldBertForMaskedLM, fivefold.FivefoldBertModel):
        with pytest.raises(ConversionError, match=r"pytorch_model\.bin is not a loadable weights-only checkpoint"):
            cls.from_pretrained(bert_src)
    assert not marker.exists()


def _hub_cache_snapshot(src, root):
    """The layout huggingface_hub downloads into: snapshots/<rev>/<file> are symlinks into ../../blobs/."""
    blobs, snapshot = root / "blobs", root / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, path in enumerate(sorted(src.iterdir())):
        shutil.copy2(path, blobs / f"blob{i}")
        (snapshot / path.name).symlink_to(f"../../blobs/blob{i}")
    return snapshot


def test_hub_cache_snapshot_symlinks_are_inside(stock_checkpoint, tmp_path):
    sharded = fivefold.export(
        fivefold.convert(stock_checkpoint("bert", "BertForMaskedLM"), tmp_path / "ours", progress=False),
        tmp_path / "stock-sharded",
        max_shard_size="20KB",
        progress=False,
    )
    snapshot = _hub_cache_snapshot(sharded, tmp_path / "models--someone--bert")
    assert (snapshot / "model.safetensors.index.json").is_file()
    assert (fivefold.convert(snapshot, tmp_path / "dst", progress=False) / "config.json").is_file()


# --- config.json ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"hidden_size": "32"}, ["hidden_size", "expected int", "'32'"]),
        ({"vocab_size": -1}, ["vocab_size must be a positive integer, got -1"]),
        ({"architectures": "BertForMaskedLM"}, ["architectures must be a list of class names"]),
        ({"model_type": None}, ["unsupported model_type None"]),
    ],
    ids=["wrong-type", "non-positive", "architectures-not-a-list", "model-type-null"],
)
def test_config_field_errors_name_the_field(bert_src, tmp_path, change, needles):
    config = json.loads((bert_src / "config.json").read_text())
    (bert_src / "config.json").write_text(json.dumps({**config, **change}))
    _assert_fails(bert_src, tmp_path / "dst", "config.json", *needles)
    with pytest.raises(ConversionError) as err:
        fivefold.convert(bert_src, tmp_path / "dst", progress=False)
    assert "Validation error for" not in str(err.value)  # huggingface_hub's wrapper, not the field's own message


def test_config_json_that_is_a_folder(bert_src, tmp_path):
    (bert_src / "config.json").unlink()
    (bert_src / "config.json").mkdir()
    _assert_fails(bert_src, tmp_path / "dst", "config.json", "is a folder, not a regular file")


WIDTH_AND_HEADS = (("hidden_size", "num_attention_heads"), ("n_embd", "n_head"))


def test_heads_not_dividing_the_width_every_architecture(arch_src, tmp_path):
    arch, src = arch_src
    pair = next(((w, h) for w, h in WIDTH_AND_HEADS if w in arch.tiny and h in arch.tiny), None)
    if pair is None:
        pytest.skip("heads and width are independent here (T5's d_kv) or named otherwise")
    width, heads = pair
    bad = next(n for n in range(arch.tiny[heads] + 1, arch.tiny[width]) if arch.tiny[width] % n)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, heads: bad}))
    _assert_fails(src, tmp_path / "dst", "config.json", "is not a valid", f"({bad})")


# Architecture-specific config rules: (stock model_type, fields changed, what the error must name). A row whose
# architecture has not landed is skipped.
CONFIG_RULES = [
    ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 5}, ["num_experts_per_tok", "num_local_experts"]),
]


@pytest.mark.parametrize(("model_type", "change", "needles"), CONFIG_RULES, ids=[r[0] for r in CONFIG_RULES])
def test_architecture_config_rules(stock_checkpoint, tmp_path, model_type, change, needles):
    arch = next((a for a in ARCHITECTURES if a.stock_model_type == model_type), None)
    if arch is None:
        pytest.skip(f"{model_type} has not landed")
    src = _copy(stock_checkpoint(model_type, stock_class_name(arch.base_model)), tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **change}))
    _assert_fails(src, tmp_path / "dst", "config.json", *needles)


def test_export_names_a_bad_config(converted, tmp_path):
    _, dst = converted("bert", "BertForMaskedLM")
    broken = _copy(dst, tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "num_attention_heads": 5}))
    with pytest.raises(ConversionError, match=r"config\.json is not a valid bert config: hidden_size \(32\)"):
        fivefold.export(broken, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# --- side files: data only ---------------------------------------------------------------------------------


def test_side_files_never_carry_code(bert_src, tmp_path):
    (bert_src / "tokenizer_hook.py").write_text("open('pwned', 'w')\n")
    (bert_src / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    tokenizer_config = {"tokenizer_class": "BertTokenizer", "auto_map": {"AutoTokenizer": ["evil/repo--tok.T", None]}}
    (bert_src / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    with pytest.warns(CheckpointWarning, match="dropped auto_map .* from tokenizer_config.json"):
        dst = fivefold.convert(bert_src, tmp_path / "dst", progress=False)
    assert not (dst / "tokenizer_hook.py").exists()
    assert (dst / "vocab.txt").read_text() == "[PAD]\n[UNK]\n"
    assert json.loads((dst / "tokenizer_config.json").read_text()) == {"tokenizer_class": "BertTokenizer"}


def test_side_file_linking_out_of_the_folder(bert_src, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    (bert_src / "vocab.txt").symlink_to(secret)
    _assert_fails(bert_src, tmp_path / "dst", "vocab.txt", "outside the folder")


@pytest.mark.parametrize("command", ["convert", "export"])
def test_generation_config_linking_out_of_the_folder(stock_checkpoint, converted, tmp_path, command):
    """generation_config.json goes through the side-file checks like every copied file (a secret outside SRC
    never lands in DST)."""
    origin = stock_checkpoint("gpt2", "GPT2LMHeadModel") if command == "convert" else converted("gpt2", "GPT2Model")[1]
    src = _copy(origin, tmp_path / "src")
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "hf_secret"}')
    (src / "generation_config.json").unlink(missing_ok=True)
    (src / "generation_config.json").symlink_to(secret)
    with pytest.raises(ConversionError, match=r"generation_config\.json in .* outside the folder"):
        getattr(fivefold, command)(src, tmp_path / "dst", progress=False)
    code, stderr = _cli_in_process(command, src, tmp_path / "dst")
    assert code == 2 and "outside the folder" in stderr
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_side_file_that_is_not_a_regular_file(bert_src, tmp_path, kind):
    if kind == "fifo":
        os.mkfifo(bert_src / "vocab.txt")
        _assert_fails(bert_src, tmp_path / "dst", "vocab.txt", "is a FIFO, not a regular file")
    else:
        (bert_src / "tokenizer_extra").mkdir()
        _assert_fails(bert_src, tmp_path / "dst", "tokenizer_extra", "is a folder, not a regular file")


# --- config.json and the other JSON files: bounded reads ------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_config_json_that_is_not_a_regular_file(bert_src, tmp_path, kind):
    (bert_src / "config.json").unlink()
    if kind == "fifo":
        os.mkfifo(bert_src / "config.json")  # reading it would wait forever for a writer
    else:
        (bert_src / "config.json").symlink_to("/dev/zero")  # reading it would never end
    needle = "is a FIFO, not a regular file" if kind == "fifo" else "is a character device, not a regular file"
    _assert_fails(bert_src, tmp_path / "dst", "config.json", needle)
    with pytest.raises(ConversionError, match=needle):  # the stock folder, loaded directly
        fivefold.FivefoldBertForMaskedLM.from_pretrained(bert_src)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _with_field(text: str, value: str) -> str:
    """A JSON object's text with one more field, "x", whose value is written as given."""
    return text.rstrip()[:-1] + f', "x": {value}}}'


ABSURD_JSON = {
    "config-100k-deep": ("config.json", lambda text: _with_field(text, _deep(100_000)), "nested too deeply"),
    "config-40-deep": ("config.json", lambda text: _with_field(text, _deep(40)), "nested 41 levels deep"),
    "config-5000-digits": ("config.json", lambda text: _with_field(text, "9" * 5000), "integer of 5000 digits"),
    "tokenizer-config-5000-digits": ("tokenizer_config.json", lambda _: f'{{"x": {"9" * 5000}}}', "integer of 5000"),
    "index-5000-digits": ("model.safetensors.index.json", None, "integer of 5000 digits"),
}


@pytest.mark.parametrize("case", ABSURD_JSON)
def test_absurd_json(bert_src, tmp_path, case):
    name, change, needle = ABSURD_JSON[case]
    if change is None:  # a sharded checkpoint whose index holds the number
        keys = list(load_file(bert_src / "model.safetensors"))
        (bert_src / "model.safetensors").rename(bert_src / "model-00001-of-00001.safetensors")
        weight_map = dict.fromkeys(keys, "model-00001-of-00001.safetensors")
        text = json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
        (bert_src / name).write_text(text.replace('"total_size": 0', f'"total_size": {"9" * 5000}'))
    else:
        path = bert_src / name
        path.write_text(change(path.read_text() if path.exists() else "{}"))
    _assert_fails(bert_src, tmp_path / "dst", name, needle)


# --- absurd configs: refused on their numbers, before any model is built -----------------------------------


def _stock_src(stock_checkpoint, tmp_path, model_type: str, change: dict):
    arch = next(a for a in ARCHITECTURES if a.stock_model_type == model_type)
    src = _copy(stock_checkpoint(model_type, stock_class_name(arch.base_model)), tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **change}))
    return arch, src


@pytest.fixture
def no_model_is_built(monkeypatch):
    """Fails the test if a model is built (even on the meta device) before the error."""
    from fivefold.conversion import validation

    def refuse(*args):
        raise AssertionError("a model was built before the config was refused")

    monkeypatch.setattr(validation, "_build_on_meta", refuse)


ABSURD_SIZES = [
    ("bert", {"num_hidden_layers": 10**6}, "num_hidden_layers is 1000000, past 65536"),
    ("bert", {"num_hidden_layers": 10**9}, "num_hidden_layers is 1000000000, past 65536"),
    ("bert", {"num_hidden_layers": 5000}, "the checkpoint holds"),  # within the bound: the tensor count refuses
    ("t5", {"num_layers": 10**6}, "num_layers is 1000000, past 65536"),
    ("t5", {"num_layers": 3000, "num_decoder_layers": 3000}, "fewer than one each"),
    ("mixtral", {"num_local_experts": 10**6}, "num_local_experts is 1000000, past 65536"),
    ("mixtral", {"num_local_experts": 1000, "num_experts_per_tok": 2}, "fewer than one each"),
    ("modernbert", {"num_hidden_layers": 10**9}, "num_hidden_layers is 1000000000"),
    ("bert", {"vocab_size": 10**30}, "vocab_size is about 2**100, past 2147483647"),
    ("bert", {"hidden_size": 2**40, "num_attention_heads": 1}, "hidden_size is 1099511627776, past 2147483647"),
    ("vit", {"image_size": 2**31}, "image_size is 2147483648, past 2147483647"),
    ("bert", {"num_labels": 10**9}, "num_labels is 1000000000, past 65536"),
]


@pytest.mark.parametrize(("model_type", "change", "needle"), ABSURD_SIZES, ids=[str(r[1]) for r in ABSURD_SIZES])
def test_absurd_sizes_are_refused_before_any_model_is_built(
    stock_checkpoint, tmp_path, no_model_is_built, model_type, change, needle
):
    arch, src = _stock_src(stock_checkpoint, tmp_path, model_type, change)
    _assert_fails(src, tmp_path / "dst", needle)
    with pytest.raises(ConversionError, match=needle.replace("**", r"\*\*")):  # the stock folder, loaded directly
        arch.base_model.from_pretrained(src)


def test_sizes_whose_product_overflows(stock_checkpoint, tmp_path):
    """Each size within bounds, the position table they imply past any tensor's byte count: one line."""
    _, src = _stock_src(stock_checkpoint, tmp_path, "vit", {"image_size": 2**30, "patch_size": 1})
    _assert_fails(src, tmp_path / "dst", "cannot build FivefoldViTModel from this config")


BAD_VALUES = [
    ("bert", {"hidden_dropout_prob": 5.0}, "hidden_dropout_prob must be a probability in [0, 1], got 5.0"),
    ("bert", {"hidden_act": "bogus"}, "hidden_act 'bogus' is not an activation transformers knows"),
    ("gpt2", {"activation_function": "bogus"}, "activation_function 'bogus' is not an activation"),
    ("bert", {"layer_norm_eps": float("nan")}, "layer_norm_eps must be a finite number >= 0, got nan"),
    ("bert", {"layer_norm_eps": float("inf")}, "layer_norm_eps must be a finite number >= 0, got inf"),
    ("bert", {"layer_norm_eps": -1e-12}, "layer_norm_eps must be a finite number >= 0, got -1e-12"),
    ("t5", {"layer_norm_epsilon": -1.0}, "layer_norm_epsilon must be a finite number >= 0"),
    ("mixtral", {"rms_norm_eps": float("nan")}, "rms_norm_eps must be a finite number >= 0"),
]


@pytest.mark.parametrize(("model_type", "change", "needle"), BAD_VALUES, ids=[str(r[1]) for r in BAD_VALUES])
def test_config_values_no_model_can_take(stock_checkpoint, tmp_path, model_type, change, needle):
    arch, src = _stock_src(stock_checkpoint, tmp_path, model_type, change)
    _assert_fails(src, tmp_path / "dst", "config.json", needle)
    with pytest.raises((ValueError, StrictDataclassError), match=re.escape(needle)):  # a config built in code
        arch.config_class(**{**arch.tiny, **change})


# --- tensors and shard names --------------------------------------------------------------------------------


def test_tensor_stored_as_u32(bert_src, tmp_path):
    path = bert_src / "model.safetensors"
    key = "bert.embeddings.word_embeddings.weight"
    path.write_bytes(_with_header(path.read_bytes(), lambda h: h[key].__setitem__("dtype", "U32")))
    _assert_fails(bert_src, tmp_path / "dst", key, "torch.uint32", "floating-point")


@pytest.mark.parametrize("name", ["model\0.safetensors", "x" * 300 + ".safetensors", "a/" * 3000 + "b.safetensors"])
def test_shard_name_the_file_system_cannot_hold(bert_src, tmp_path, name):
    keys = list(load_file(bert_src / "model.safetensors"))
    (bert_src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(keys, name)}))
    _assert_fails(bert_src, tmp_path / "dst", "model.safetensors.index.json", "names an invalid shard file")


# --- a checkpoint whose activations outgrow fp16 ------------------------------------------------------------


def test_t5_fp16_overflow_is_clamped_as_in_stock(stock_checkpoint, tmp_path):
    """Feed-forward weights large enough that fp16 activations overflow: stock stays finite (its `wo` kept in
    fp32, then its fp16 clamps), and fivefold gives the same logits, loaded in fp16 or cast with .half()."""
    import transformers

    src = _copy(stock_checkpoint("t5", "T5ForConditionalGeneration"), tmp_path / "src")
    _rewrite_tensors(src, lambda t: t.update({k: v * 3000 for k, v in t.items() if ".DenseReluDense." in k}))
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 8, 1]]), "decoder_input_ids": torch.tensor([[0, 5, 6]])}
    for load in (
        lambda cls: cls.from_pretrained(src, dtype=torch.float16),
        lambda cls: cls.from_pretrained(src).half(),
    ):
        stock = load(transformers.T5ForConditionalGeneration).eval()
        ours = load(fivefold.FivefoldT5ForConditionalGeneration).eval()
        with torch.no_grad():
            want, got = stock(**inputs).logits, ours(**inputs).logits
        assert want.dtype == got.dtype == torch.float16
        assert torch.isfinite(want).all() and torch.isfinite(got).all()
        assert (want.float() - got.float()).abs().max() <= 1e-2
