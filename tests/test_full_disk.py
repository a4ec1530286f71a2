"""A disk that fills up loses nothing: `convert`, `export` and `save_pretrained` onto a real file system too small
for them (a tmpfs mounted for the test) leave DST absent or the old folder byte for byte, no temporary folder, and
one line saying how much space was needed and how much there was. Where the file system says it is too small, the
write is refused before it starts; where it fills up during the write (another writer), the kernel's ENOSPC is
reported the same way, on a line of its own after the progress bar."""

import gc
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from launching import launch

import fivefold
from fivefold import ConversionError, cli
from fivefold.conversion import space, writer


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _leftovers(dst: Path) -> list[str]:
    return sorted(p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}."))


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _leave_free(disk: Path, nbytes: float) -> None:
    """Shrinks the tmpfs at `disk` to what it holds plus `nbytes` free."""
    size = shutil.disk_usage(disk).used + -(-int(nbytes) // 4096) * 4096
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(nbytes) -> the folder of a tmpfs of that size, unmounted after the test. Needs root (mount);
    without it, `test_atomic_output.py::test_disk_full` injects ENOSPC instead."""
    mounted = []

    def mount(nbytes: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        size = -(-int(nbytes) // 4096) * 4096
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()})")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _old_and_new(small_disk, stock_checkpoint, converted, room: float):
    """A disk holding an earlier conversion at DST, with `room` times the next conversion's size free."""
    src = stock_checkpoint("roberta", "RobertaForMaskedLM")
    _, reference = converted("roberta", "RobertaForMaskedLM")
    _, old = converted("bert", "BertForMaskedLM")
    disk = small_disk(4 * _bytes(old))
    dst = Path(shutil.copytree(old, disk / "dst"))
    _leave_free(disk, room * _bytes(reference))
    return src, dst, _snapshot(dst)


@pytest.mark.parametrize("with_old", [False, True], ids=["fresh", "force-over-old"])
def test_convert_refused_before_it_starts_when_the_disk_is_too_small(small_disk, stock_checkpoint, converted, with_old):
    src, dst, before = _old_and_new(small_disk, stock_checkpoint, converted, room=0.4)
    if not with_old:
        dst = dst.with_name("fresh")
    free = space.free_bytes(dst.parent)
    with pytest.raises(ConversionError) as err:
        fivefold.convert(src, dst, force=with_old, progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert f"not enough space to write {dst}: it needs at least " in message
    assert f"; {space.human_size(free)} were free on {dst.parent}; nothing was written there" in message
    assert _snapshot(dst) == before if with_old else not dst.exists()
    assert _leftovers(dst) == []


def _fill_the_disk_after_the_first_shard(monkeypatch) -> None:
    """Another writer takes every free byte once the first shard is written: the kernel's ENOSPC on the next."""
    real_save = writer.save_file

    def save_then_fill(tensors, path, metadata=None, **layout):
        real_save(tensors, path, metadata=metadata, **layout)
        monkeypatch.setattr(writer, "save_file", real_save)
        with open(Path(path).parent.parent / "ballast", "wb") as f:
            os.posix_fallocate(f.fileno(), 0, space.free_bytes(Path(path).parent))

    monkeypatch.setattr(writer, "save_file", save_then_fill)


@pytest.mark.parametrize("command", ["convert", "export"])
def test_disk_filling_up_during_the_write(small_disk, stock_checkpoint, converted, monkeypatch, capfd, command):
    src, dst, before = _old_and_new(small_disk, stock_checkpoint, converted, room=1.5)
    if command == "export":
        src = converted("roberta", "RobertaForMaskedLM")[1]
    _fill_the_disk_after_the_first_shard(monkeypatch)
    assert cli.main([command, str(src), str(dst), "--force", "--max-shard-size", "20KB"]) == 2
    gc.collect()  # a bar left open would redraw itself here, after the error
    stderr = capfd.readouterr().err
    lines = stderr.rstrip("\n").split("\n")
    # The bar is closed first: the error is the last line, whole, on a line of its own.
    error = lines[-1]
    assert error.startswith(f"fivefold {command}: error: cannot write {dst}: No space left on device ("), lines
    assert "; it needs at least " in error and " were free on " in error and " when it started" in error
    assert error.endswith("; the old one is unchanged")
    assert "reading, checking, writing" in lines[-2]  # the bar was drawn, on the line before
    (dst.parent / "ballast").unlink()
    assert _snapshot(dst) == before and _leftovers(dst) == []


@pytest.fixture
def saved_on_a_small_disk(small_disk, converted):
    """An earlier save_pretrained at DST on a disk with room for about half of one more, and the model."""
    _, ours = converted("roberta", "RobertaForMaskedLM")
    model = fivefold.FivefoldRobertaForMaskedLM.from_pretrained(ours)
    disk = small_disk(4 * _bytes(ours))
    dst = disk / "saved"
    model.save_pretrained(dst)
    (dst / "vocab.txt").write_text("the user's own file\n")
    _leave_free(disk, 0.5 * _bytes(ours))
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # the next save differs from the one on disk
    return model, dst, _snapshot(dst)


@pytest.mark.parametrize("shards", ["plain", "sharded"])
def test_save_pretrained_onto_a_full_disk(saved_on_a_small_disk, monkeypatch, shards):
    model, dst, before = saved_on_a_small_disk
    options = {"max_shard_size": "20KB"} if shards == "sharded" else {}
    if shards == "sharded":
        # A file system that does not say how full it is (some network ones): the kernel's ENOSPC mid-write.
        monkeypatch.setattr(space, "free_bytes", lambda folder: None)
    with pytest.raises(ConversionError) as err:
        model.save_pretrained(dst, **options)
    message = str(err.value)
    assert "\n" not in message and "it needs at least " in message
    if shards == "plain":
        assert f"not enough space to write {dst}" in message and f"were free on {dst.parent}" in message
    else:
        assert f"cannot write {dst}: No space left on device" in message and "the old one is unchanged" in message
    assert _snapshot(dst) == before and _leftovers(dst) == []


@pytest.mark.slow
def test_sharded_saves_onto_a_full_disk_end_every_rank(small_disk, converted, tmp_path):
    """An expert-parallel, a fully sharded and a tensor-parallel Mixtral saved by both of 2 gloo ranks onto a disk
    holding an earlier save: refused before the write where the file system says it is too small, the kernel's ENOSPC
    where it does not say. Rank 0 raises its one-line error and rank 1 the same, within the launch's timeout
    (transformers' barrier after the write held rank 1 there while rank 0 lived on); a save no rank is to write
    (`is_main_process=False`) writes nothing. The old folder is left byte for byte, with no temporary folder."""
    _, folder = converted("mixtral", "MixtralForCausalLM")
    disk = small_disk(4 * _bytes(folder))
    dst = disk / "saved"
    fivefold.FivefoldMixtralForCausalLM.from_pretrained(folder).save_pretrained(dst)
    before = _snapshot(dst)
    _leave_free(disk, 0.5 * _bytes(folder))
    ranks = launch("sharded_save_full_disk", 2, tmp_path, {"checkpoint": str(folder), "dst": str(dst)}, timeout=180)
    for layout in ("expert parallel", "fully sharded", "tensor parallel"):
        refused, enospc = ranks[0][f"{layout}, refused"], ranks[0][f"{layout}, ENOSPC"]
        assert refused.startswith(f"ConversionError: not enough space to write {dst}: it needs at least "), refused
        assert f"were free on {dst.parent}; nothing was written there" in refused
        assert enospc.startswith(f"ConversionError: cannot write {dst}: No space left on device"), enospc
        assert enospc.endswith("; the old one is unchanged") and "\n" not in enospc + refused
        for case, message in ((f"{layout}, refused", refused), (f"{layout}, ENOSPC", enospc)):
            error = message.removeprefix("ConversionError: ")
            assert ranks[1][case] == f"ConversionError: rank 0 could not save {dst}: {error}", ranks[1][case]
        assert ranks[0][f"{layout}, not written"] is None and ranks[1][f"{layout}, not written"] is None
    assert _snapshot(dst) == before and _leftovers(dst) == []


def test_needed_space_is_a_lower_bound(converted, tmp_path, monkeypatch):
    """The check refuses only what cannot fit: what it asks for is never more than the conversion writes."""
    src, _ = converted("roberta", "RobertaForMaskedLM")
    seen = []
    real = space.check_space
    monkeypatch.setattr(writer, "check_space", lambda dst, needed: seen.append(needed) or real(dst, needed))
    out = fivefold.convert(src, tmp_path / "out", progress=False)
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert 0.5 * written < seen[0] <= written
