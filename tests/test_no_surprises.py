"""No network, no surprises: importing fivefold and converting, loading, exporting and verifying local checkpoints
never open a connection; the code shipped in a checkpoint is fivefold's own modules and nothing else."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import transformers

import fivefold
from fivefold import cli
from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.remote_code import flat_module_name, flatten_source, shipped_modules
from fivefold.conversion.verify import verify

NETWORK_BLOCKED = textwrap.dedent(
    """
    import json, socket, sys

    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(repr(args)[:300])
        raise OSError("network blocked by test_no_surprises")

    socket.socket.connect = socket.socket.connect_ex = refuse
    socket.create_connection = socket.getaddrinfo = refuse

    out, work = sys.argv[1], sys.argv[2]
    import transformers
    import fivefold
    from fivefold.architectures import ARCHITECTURES, stock_class_name
    from fivefold.conversion.samples import build_stock_checkpoint
    from fivefold.conversion.verify import verify

    done = []
    for arch in ARCHITECTURES:
        name = stock_class_name(arch.base_model)
        src = build_stock_checkpoint(arch.stock_model_type, name, f"{work}/{name}-stock")
        dst = fivefold.convert(src, f"{work}/{name}-fivefold", progress=False)
        transformers.AutoModel.from_pretrained(dst)
        transformers.AutoConfig.from_pretrained(dst)
        arch.base_model.from_pretrained(src)  # a stock folder, converted in memory
        fivefold.export(dst, f"{work}/{name}-exported", progress=False)
        verify(src, dst)
        done.append(arch.stock_model_type)
    json.dump({"attempts": attempts, "done": done}, open(out, "w"))
    """
)


@pytest.mark.slow
def test_no_network_calls(tmp_path):
    # Not offline mode: nothing may even try, whatever HF_HUB_OFFLINE says.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-c", NETWORK_BLOCKED, str(out), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["done"] == [a.stock_model_type for a in ARCHITECTURES]
    assert report["attempts"] == []


def _expected_code(arch) -> dict[str, str]:
    sources = shipped_modules(arch.config_class, *arch.models.values())
    return {f"{flat_module_name(name)}.py": flatten_source(name, source) for name, source in sources.items()}


def _code_in(folder) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if p.suffix in (".py", ".pyc", ".so") or p.is_dir()}


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.stock_model_type)
def test_shipped_code_is_fivefold_and_nothing_else(arch, stock_checkpoint, tmp_path):
    name = stock_class_name(arch.base_model)
    src = tmp_path / "src"
    src.mkdir()
    for path in stock_checkpoint(arch.stock_model_type, name).iterdir():
        (src / path.name).write_bytes(path.read_bytes())
    # A stranger's checkpoint that brings code of its own, and a config pointing at it.
    (src / "modeling_custom.py").write_text("import os; os.system('echo pwned')\n")
    (src / "configuration_bert.py").write_text("raise SystemExit('not fivefold code')\n")
    config = json.loads((src / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_custom.Custom", "AutoConfig": "someone/else--configuration.C"}
    (src / "config.json").write_text(json.dumps(config))

    expected = _expected_code(arch)
    dst = fivefold.convert(src, tmp_path / "dst", progress=False)
    assert _code_in(dst) == expected
    auto_map = json.loads((dst / "config.json").read_text())["auto_map"]
    assert {ref.split(".")[0] + ".py" for ref in auto_map.values()} <= set(expected)

    saved = tmp_path / "saved"
    transformers.AutoModel.from_pretrained(dst).save_pretrained(saved)
    assert _code_in(saved) == expected


# --- a checkpoint's config never chooses what runs ---------------------------------------------------------


def _bert_src_with(stock_checkpoint, folder, **fields):
    shutil.copytree(stock_checkpoint("bert", "BertForMaskedLM"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


@pytest.mark.parametrize("value", ["kernels-community/x", "a/b", "flash_attention_2", "bogus"])
def test_checkpoint_config_never_selects_the_attention_kernel(stock_checkpoint, tmp_path, monkeypatch, value):
    """A config.json's attn_implementation (a Hub kernel to download and import, or a name that would fail) is
    ignored everywhere: convert, loading the stock folder, loading a fivefold folder; the caller's choice holds."""
    asked = []
    real_check = transformers.PreTrainedModel._check_and_adjust_attn_implementation

    def record(self, attn_implementation, *args, **kwargs):
        asked.append(attn_implementation)
        return real_check(self, attn_implementation, *args, **kwargs)

    monkeypatch.setattr(transformers.PreTrainedModel, "_check_and_adjust_attn_implementation", record)
    src = _bert_src_with(stock_checkpoint, tmp_path / "src", attn_implementation=value, experts_implementation=value)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["convert", str(src), str(tmp_path / "dst")]) == 0, stderr.getvalue()
    written = json.loads((tmp_path / "dst" / "config.json").read_text())
    assert "attn_implementation" not in written and "experts_implementation" not in written
    assert fivefold.FivefoldBertForMaskedLM.from_pretrained(src).config._attn_implementation != value
    assert max(verify(src, tmp_path / "dst").values()) <= 1e-4  # the stock model too, from the sanitised fields

    ours = tmp_path / "dst"
    (ours / "config.json").write_text(json.dumps({**written, "attn_implementation": value}))
    assert transformers.AutoModelForMaskedLM.from_pretrained(ours).config._attn_implementation != value
    chosen = transformers.AutoModelForMaskedLM.from_pretrained(ours, attn_implementation="eager")
    assert chosen.config._attn_implementation == "eager"
    assert value not in asked


def test_config_fields_that_select_code_are_dropped(stock_checkpoint, tmp_path):
    """DST's config keeps the fields of the config class and plain numbers; it drops whatever would choose code,
    kernels or classes on a later load, and unknown strings and objects. (A quantized source is refused outright:
    test_gpt_oss.py.)"""
    selectors = {
        "tokenizer_class": "someone/else--tokenization.Tok",
        "processor_class": "someone/else--processing.Proc",
        "trust_remote_code": True,
        "auto_map": {"AutoModel": "someone/else--modeling.M"},
        "custom_pipelines": {"fill-mask": {"impl": "pipeline.P"}},
        "experts_implementation": "kernels-community/x",
    }
    unknown = {"note": "https://example.com/payload", "blob": {"class": "x.Y"}, "legacy_count": 3}
    data = {"prefix": "Summarize: ", "finetuning_task": "sst-2"}  # v4's strings, which pipelines read
    src = _bert_src_with(stock_checkpoint, tmp_path / "src", **selectors, **unknown, **data)
    dst = fivefold.convert(src, tmp_path / "dst", progress=False)
    exported = fivefold.export(dst, tmp_path / "exported", progress=False)
    for folder in (dst, exported):
        written = json.loads((folder / "config.json").read_text())
        assert not set(selectors) & set(written) - {"auto_map"}, folder
        assert "note" not in written and "blob" not in written and written["legacy_count"] == 3
        assert {k: written.get(k) for k in data} == data
    assert set(json.loads((dst / "config.json").read_text())["auto_map"]) >= {"AutoConfig", "AutoModel"}  # ours
    assert "auto_map" not in json.loads((exported / "config.json").read_text())
    model = fivefold.FivefoldBertForMaskedLM.from_pretrained(src)  # the stock folder, loaded directly
    assert getattr(model, "hf_quantizer", None) is None and not hasattr(model.config, "quantization_config")
