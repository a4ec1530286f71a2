"""The shipped code and weights are what the conversion wrote: the model card records the fivefold version and the
sha256 of every file, `fivefold verify --integrity` finds a corrupted, missing or added file, and a converted
folder loads and runs with stock transformers alone, offline, opening no socket and writing nothing outside the
Hub cache."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub.repocard import metadata_load

import fivefold
from fivefold import cli
from fivefold.conversion.integrity import sha256_of


@pytest.fixture
def sharded(stock_checkpoint, tmp_path):
    src = stock_checkpoint("gpt2", "GPT2LMHeadModel")
    return fivefold.convert(src, tmp_path / "gpt2", max_shard_size="20KB", progress=False)


def test_card_records_the_version_and_every_file(sharded):
    recorded = metadata_load(sharded / "README.md")["fivefold"]
    assert recorded["version"] == fivefold.__version__
    files = {p.name for p in sharded.iterdir() if p.name != "README.md"}
    assert set(recorded["sha256"]) == files
    assert any(n.startswith("model-00002-of-") for n in files) and any(n.startswith("modeling_") for n in files)
    assert all(recorded["sha256"][name] == sha256_of(sharded / name) for name in files)
    for code in sharded.glob("*.py"):
        assert code.read_text().startswith(f"# Shipped by fivefold {fivefold.__version__}: a flat copy of ")


def _verify(folder: Path, capsys) -> tuple[int, str, str]:
    code = cli.main(["verify", "--integrity", str(folder)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_verify_integrity_names_each_file_that_changed(sharded, capsys):
    code, out, _ = _verify(sharded, capsys)
    total = len(list(sharded.iterdir())) - 1
    assert code == 0 and f"{total} of {total} files match their recorded sha256" in out

    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # one bit pattern of one weight: loads fine, computes wrong
    shard.write_bytes(bytes(data))
    (sharded / "modeling_gpt2.py").open("a").write("import os  # an edit\n")
    sorted(sharded.glob("model-*.safetensors"))[0].unlink()
    (sharded / "modeling_extra.py").write_text("print('hello')\n")
    code, out, err = _verify(sharded, capsys)
    assert code == 1
    lines = err.strip().splitlines()
    assert f"fivefold verify: {shard.name}: corrupted (sha256 " in err and ", the card says " in err
    assert "fivefold verify: modeling_gpt2.py: corrupted" in err
    assert "fivefold verify: model-00001-of-" in err and ": missing" in err
    assert "fivefold verify: modeling_extra.py: not in the card (a file the conversion did not write)" in err
    assert len(lines) == 4
    assert f"{total - 3} of {total} files match their recorded sha256; 4 problem(s)" in out


def test_verify_integrity_of_a_folder_without_hashes(converted, tmp_path, capsys):
    _, ours = converted("bert", "BertForMaskedLM")
    copy = Path(shutil.copytree(ours, tmp_path / "copy"))
    (copy / "README.md").write_text("# a card without metadata\n")
    code, _, err = _verify(copy, capsys)
    assert code == 2 and "lists no file hashes (fivefold.sha256): convert the folder again" in err
    assert len(err.strip().splitlines()) == 1


# Stock transformers alone (importing fivefold fails), no network namespace, HOME a temporary folder; an audit hook
# records every socket and every file opened for writing (or created, renamed, removed) outside the Hub cache.
OFFLINE_STOCK_LOAD = textwrap.dedent(
    """
    import json, os, sys
    stock, folder, hf_home = sys.argv[1], sys.argv[2], os.path.realpath(os.environ["HF_HOME"])
    sys.modules["fivefold"] = None  # not importable: stock transformers alone
    seen, phase = [], "stock"
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def outside(path, creating_folders=False):
        if isinstance(path, int):
            return False
        path = os.path.realpath(os.fsdecode(path))
        if creating_folders and (hf_home + os.sep).startswith(path + os.sep):
            return False  # a folder on the way to the cache
        return not (path == hf_home or path.startswith(hf_home + os.sep) or path == os.devnull)

    def record(event, args):
        seen.append([event, repr(args)[:200], phase])

    def audit(event, args):
        if event.startswith("socket."):
            record(event, args)
        elif event == "open" and args[0] is not None:
            mode, flags = args[1] or "", args[2] or 0
            if (any(c in str(mode) for c in "wax+") or flags & WRITE) and outside(args[0]):
                record(event, args)
        elif event in ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link", "shutil.rmtree",
                       "os.truncate", "os.chmod"):
            if outside(args[0], creating_folders=event == "os.mkdir"):
                record(event, args)

    sys.addaudithook(audit)
    import torch
    from transformers import AutoModelForCausalLM

    def run(path, **options):
        model = AutoModelForCausalLM.from_pretrained(path, **options)
        ids = torch.tensor([[5, 17, 3, 42]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        return model, logits[0, -1, :8].tolist(), model.generate(ids, max_new_tokens=4, do_sample=False)[0].tolist()

    run(stock)  # stock transformers' own GPT-2 first: its imports and their probes happen here
    phase = "shipped"
    model, logits, generated = run(folder, trust_remote_code=True)
    print(json.dumps({"class": type(model).__module__, "logits": logits, "generated": generated, "seen": seen}))
    """
)


@pytest.mark.slow
def test_stock_transformers_loads_a_folder_offline_and_writes_nothing_outside_the_cache(converted, tmp_path):
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode:
        pytest.skip("needs `unshare -n` (root, Linux)")
    src, ours = converted("gpt2", "GPT2LMHeadModel")
    folder = Path(shutil.copytree(ours, tmp_path / "model"))
    home = tmp_path / "home"
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "HF_HOME": str(home / ".cache" / "huggingface"),
           "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    home.mkdir()
    done = subprocess.run(["unshare", "-n", sys.executable, "-c", OFFLINE_STOCK_LOAD, str(src), str(folder)],
                          capture_output=True, text=True, env=env, cwd=home, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["class"].startswith("transformers_modules.")  # the shipped code ran, not fivefold's package
    # After stock transformers loaded and ran its own GPT-2 in the same process, the shipped code's load and run
    # open no socket and write nothing outside the cache; and nothing at all reached for the network (what the
    # stock phase records are the libraries' import-time probes: urllib3's IPv6 bind to ::1, tempfile's and
    # torch's cache folders).
    assert [event for event in report["seen"] if event[2] == "shipped"] == []
    network = ("socket.connect", "socket.getaddrinfo", "socket.sendto", "socket.sendmsg", "socket.gethostbyname")
    assert [event for event in report["seen"] if event[0] in network] == []
    model = fivefold.FivefoldGPT2LMHeadModel.from_pretrained(folder)
    ids = torch.tensor([[5, 17, 3, 42]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits[0, -1, :8]
    torch.testing.assert_close(torch.tensor(report["logits"]), expected)
    assert report["generated"] == model.generate(ids, max_new_tokens=4, do_sample=False)[0].tolist()
    assert not (folder / "__pycache__").exists()
