"""No network, no surprises: importing fivefold and converting, loading, exporting and verifying local checkpoints
never open a connection; the code shipped in a checkpoint is fivefold's own modules and nothing else."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import transformers

import fivefold
from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.remote_code import flat_module_name, flatten_source, shipped_modules

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
