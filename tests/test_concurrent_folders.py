"""Concurrent readers and writers (issue 28, row 6). A load that meets `fivefold convert --force` replacing its
folder between two shards gets the old model or the new one, never a mix (modeling/pinned_folder.py); the same
load with the folder read by its path, as transformers alone does, mixes them: the injection is real. Two
`save_pretrained` calls into one folder at once: the folder ends as one of them, whole.

The fault is injected deterministically: the loading process pauses after opening the first shard (a wrapper of
transformers' `safe_open`) until the test has replaced the folder.
"""

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import torch
from launching import environment, python
from safetensors.torch import load_file

import fivefold
from fivefold.conversion.samples import build_stock_checkpoint

from helpers import read_tensors

pytestmark = pytest.mark.slow
SHARD = "20KB"  # a tiny GPT-2 in several shards

READER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import transformers.modeling_utils as mu
    import fivefold
    from safetensors.torch import save_file
    dst, flags, out, pinned = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "pinned"
    opened = []
    stock_open = mu.safe_open

    def pausing_open(file, *args, **kwargs):
        handle = stock_open(file, *args, **kwargs)
        opened.append(str(file))
        if len(opened) == 1:  # after the first shard: the test replaces the folder now
            (flags / f"paused-{os.getpid()}").touch()
            deadline = time.monotonic() + 60
            while not (flags / "replaced").exists():
                assert time.monotonic() < deadline, "the folder was not replaced within 60 s"
                time.sleep(0.05)
        return handle

    mu.safe_open = pausing_open
    cls = fivefold.FivefoldGPT2LMHeadModel
    if not pinned:  # by path, as transformers alone reads a folder
        cls._load_whole_folder = cls._load
    model = cls.from_pretrained(dst)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, out)
    print(json.dumps({"name_or_path": model.name_or_path, "opened": len(opened)}))
    """
)


def fingerprints(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in read_tensors(folder).items() if k != "lm_head.weight"}


def same_as(got: dict, expected: dict) -> list[str]:
    return [k for k in expected if not torch.equal(got[k], expected[k])]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("concurrent")
    old = fivefold.convert(build_stock_checkpoint("gpt2", "GPT2LMHeadModel", root / "a"), root / "old",
                           max_shard_size=SHARD, progress=False)  # fmt: skip
    new = fivefold.convert(build_stock_checkpoint("gpt2", "GPT2LMHeadModel", root / "b", seed=1), root / "new",
                           max_shard_size=SHARD, progress=False)  # fmt: skip
    assert len(list(old.glob("*.safetensors"))) >= 3
    return root, old, new


@pytest.mark.parametrize("how", ["pinned", "by-path"])
def test_a_load_meets_its_folder_replaced_between_two_shards(two_models, tmp_path, how):
    root, old, new = two_models
    dst, flags = tmp_path / "dst", tmp_path / "flags"
    flags.mkdir()
    fivefold.convert(root / "a", dst, max_shard_size=SHARD, progress=False)
    reader = subprocess.Popen(
        [*python(warmed=True), "-c", READER, str(dst), str(flags), str(tmp_path / "loaded.safetensors"), how],
        env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(flags.glob("paused-*")):
            assert reader.poll() is None, reader.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the reader never opened a shard"
            time.sleep(0.05)
        fivefold.convert(root / "b", dst, max_shard_size=SHARD, force=True, progress=False)
        (flags / "replaced").touch()
        out, err = reader.communicate(timeout=120)
    finally:
        if reader.poll() is None:
            os.killpg(reader.pid, 9)
    assert reader.returncode == 0, err[-3000:]
    got = load_file(tmp_path / "loaded.safetensors")
    differ_from_old, differ_from_new = same_as(got, fingerprints(old)), same_as(got, fingerprints(new))
    if how == "by-path":
        assert differ_from_old and differ_from_new, "read by its path, the load should have mixed the two folders"
        return
    assert differ_from_old == [] or differ_from_new == [], (differ_from_old, differ_from_new)  # one model, whole
    # convert --force removed the old folder before the paused load opened its second shard: that load failed on
    # the missing file, and from_pretrained loaded again, the new folder whole
    assert differ_from_new == []
    assert json.loads(out.strip().splitlines()[-1])["name_or_path"] == str(dst)


SAVER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import fivefold
    src, dst, flags = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    model = fivefold.FivefoldGPT2LMHeadModel.from_pretrained(src)
    (flags / f"ready-{os.getpid()}").touch()
    while len(list(flags.glob("ready-*"))) < 2:  # both saves begin at the same moment
        time.sleep(0.01)
    model.save_pretrained(dst, max_shard_size="20KB")
    """
)


def test_two_saves_into_one_folder_at_once_leave_one_of_them_whole(two_models, tmp_path):
    _, old, new = two_models
    dst, flags = tmp_path / "saved", tmp_path.parent / f"{tmp_path.name}-flags"
    flags.mkdir()
    command, env = [*python(warmed=True), "-c", SAVER], environment()
    savers = [
        subprocess.Popen(
            [*command, src, dst, flags], env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        for src in (old, new)
    ]
    try:
        errors = [p.communicate(timeout=120)[1] for p in savers]
    finally:  # a hang fails the test and leaves no process behind
        for saver in savers:
            if saver.poll() is None:
                os.killpg(saver.pid, 9)
    codes = [p.returncode for p in savers]
    assert 0 in codes, errors
    for code, err in zip(codes, errors, strict=True):
        assert code == 0 or (err.strip().splitlines()[-1].startswith(("fivefold", "ConversionError"))), err[-3000:]
    got = fingerprints(dst)
    assert same_as(got, fingerprints(old)) == [] or same_as(got, fingerprints(new)) == []
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "saved"]
    assert leftovers == [], leftovers  # no temporary folder of either save
