"""Files that change under a running model: transformers maps safetensors shards into memory, so a shard truncated
or rewritten in place after the load (a copy over it, a sync tool) would kill the interpreter with SIGBUS at the
next read of a weight, or change the weights silently. fivefold's models copy file-backed CPU weights out at load:
the running model keeps the weights it loaded."""

import signal
import subprocess
import textwrap

import pytest
import torch
from launching import environment, python

import fivefold
from fivefold.modeling.owned_memory import own_file_backed_tensors

# Loads a sharded folder, then truncates one shard, zeroes another in place and deletes a third, and runs again.
CHANGED_UNDER_THE_MODEL = textwrap.dedent(
    """
    import os, sys, torch, fivefold
    folder, keep_mapped = sys.argv[1], sys.argv[2] == "1"
    fivefold.FivefoldPreTrainedModel.copy_file_backed_weights = not keep_mapped
    model = fivefold.FivefoldGPT2LMHeadModel.from_pretrained(folder)
    ids = torch.tensor([[5, 17, 3, 42]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    shards = sorted(f for f in os.listdir(folder) if f.startswith("model-"))
    os.truncate(os.path.join(folder, shards[0]), os.path.getsize(os.path.join(folder, shards[0])) // 2)
    with open(os.path.join(folder, shards[1]), "r+b") as f:
        f.seek(1024)
        f.write(bytes(os.path.getsize(os.path.join(folder, shards[1])) - 1024))
    os.remove(os.path.join(folder, shards[2]))
    with torch.no_grad():
        after = model(input_ids=ids).logits
    print("same" if torch.equal(before, after) else "changed", model.generate(ids, max_new_tokens=3).shape)
    """
)


@pytest.mark.slow
def test_shards_changed_after_the_load_never_crash_the_model(stock_checkpoint, tmp_path):
    src = stock_checkpoint("gpt2", "GPT2LMHeadModel")
    runs = {}
    for keep_mapped in (False, True):
        folder = fivefold.convert(src, tmp_path / f"mapped-{keep_mapped}", max_shard_size="20KB", progress=False)
        args = [*python(warmed=True), "-c", CHANGED_UNDER_THE_MODEL, str(folder), str(int(keep_mapped))]
        runs[keep_mapped] = subprocess.Popen(
            args, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    copied, mapped = (runs[k].communicate(timeout=600) for k in (False, True))
    assert runs[False].returncode == 0, copied[1][-3000:]
    assert copied[0].split()[0] == "same"  # the weights it loaded, whatever happened to the files
    # The fault is real: with the weights left mapped, the same run dies of SIGBUS (or, where the kernel
    # keeps the pages, computes with the changed weights).
    assert runs[True].returncode == -signal.SIGBUS or mapped[0].split()[0] == "changed", mapped


def test_only_file_backed_weights_are_copied(converted):
    _, ours = converted("gpt2", "GPT2LMHeadModel")
    model = fivefold.FivefoldGPT2LMHeadModel.from_pretrained(ours)
    assert all(p.untyped_storage().resizable() for p in model.parameters())  # memory of their own
    assert own_file_backed_tensors(model) == 0  # nothing left to copy
    fivefold.FivefoldPreTrainedModel.copy_file_backed_weights = False
    try:
        mapped = fivefold.FivefoldGPT2LMHeadModel.from_pretrained(ours)
    finally:
        fivefold.FivefoldPreTrainedModel.copy_file_backed_weights = True
    assert not any(p.untyped_storage().resizable() for p in mapped.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in mapped.parameters())
    assert own_file_backed_tensors(mapped) == nbytes
    ids = torch.tensor([[5, 17, 3]])
    with torch.no_grad():
        torch.testing.assert_close(mapped(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)
