"""Conversion output is all or nothing: a run killed halfway, a disk that fills up or an interrupted swap over
an old DST leaves DST absent or the old DST intact, and no temporary folder survives the next run."""

import errno
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import fivefold
from fivefold import ConversionError, cli
from fivefold.conversion import writer
from fivefold.conversion.errors import CheckpointWarning


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _leftovers(dst: Path) -> list[str]:
    return sorted(p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}."))


@pytest.fixture
def old_dst(stock_checkpoint, tmp_path):
    """A complete earlier conversion at DST, the one a --force run must never lose."""
    dst = fivefold.convert(stock_checkpoint("roberta", "RobertaForMaskedLM"), tmp_path / "dst", progress=False)
    return dst, _snapshot(dst)


# A conversion in its own process whose writer stops for good after the first shard is on disk: the parent
# kills it there, so the kill always lands mid-write.
KILLED_MID_WRITE = textwrap.dedent(
    """
    import sys, time
    import fivefold
    from fivefold.conversion import writer

    src, dst, marker, force = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    real_save = writer.save_file

    def save_then_hang(tensors, path, metadata=None):
        real_save(tensors, path, metadata=metadata)
        open(marker, "w").write(path)
        time.sleep(600)

    writer.save_file = save_then_hang
    fivefold.convert(src, dst, max_shard_size="20KB", force=force, progress=False)
    """
)


def _run_until(script: str, args: list, marker: Path, timeout: float = 240) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the conversion ended before the marker: {proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the conversion never reached the marker")
        time.sleep(0.05)
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("with_old", [False, True], ids=["fresh", "force-over-old"])
def test_conversion_killed_mid_write(stock_checkpoint, old_dst, tmp_path, with_old):
    src = stock_checkpoint("roberta", "RobertaForMaskedLM")
    dst, before = old_dst
    if not with_old:
        dst = tmp_path / "fresh"
    marker = tmp_path / "first-shard-written"
    proc = _run_until(KILLED_MID_WRITE, [src, dst, marker, int(with_old)], marker)
    shard = Path(marker.read_text())
    assert shard.is_file() and shard.parent.name.startswith(f".{dst.name}.tmp-")  # written beside DST
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)

    if with_old:
        assert _snapshot(dst) == before
    else:
        assert not dst.exists()
    assert _leftovers(dst) == [shard.parent.name]  # a killed process cannot clean up after itself...
    fivefold.convert(src, dst, force=with_old, progress=False)
    assert _leftovers(dst) == []  # ...the next run to the same DST does
    assert (dst / "model.safetensors").is_file()


# The portable replacement (two renames) killed between its renames: DST is missing for that instant.
KILLED_MID_SWAP = textwrap.dedent(
    """
    import os, sys
    import fivefold
    from fivefold.conversion import writer

    src, dst = sys.argv[1], sys.argv[2]
    real_replace = os.replace

    def replace_then_die(a, b):
        real_replace(a, b)
        if ".old-" in str(b):
            os.kill(os.getpid(), 9)

    writer._exchange = lambda a, b: False
    writer.os.replace = replace_then_die
    fivefold.convert(src, dst, force=True, progress=False)
    """
)


@pytest.mark.slow
def test_interrupted_two_step_swap_restores_old_destination(stock_checkpoint, old_dst):
    src = stock_checkpoint("roberta", "RobertaForMaskedLM")
    dst, before = old_dst
    result = subprocess.run([sys.executable, "-c", KILLED_MID_SWAP, str(src), str(dst)], capture_output=True)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert not dst.exists()  # the instant the atomic exchange avoids
    assert any(name.startswith(f".{dst.name}.old-") for name in _leftovers(dst))
    with pytest.warns(CheckpointWarning, match="restored"), pytest.raises(ConversionError, match="already exists"):
        fivefold.convert(src, dst, progress=False)
    assert _snapshot(dst) == before
    assert _leftovers(dst) == []


def test_failed_two_step_swap_puts_old_destination_back(stock_checkpoint, old_dst, monkeypatch):
    src = stock_checkpoint("roberta", "RobertaForMaskedLM")
    dst, before = old_dst
    real_replace = os.replace

    def fail_second_rename(a, b):
        if Path(b) == dst and ".tmp-" in Path(a).name:
            raise OSError(errno.EIO, "Input/output error", str(b))
        real_replace(a, b)

    monkeypatch.setattr(writer, "_exchange", lambda a, b: False)
    monkeypatch.setattr(writer.os, "replace", fail_second_rename)
    with pytest.raises(ConversionError, match="Input/output error"):
        fivefold.convert(src, dst, force=True, progress=False)
    monkeypatch.undo()
    assert _snapshot(dst) == before
    assert _leftovers(dst) == []


def test_atomic_exchange_swaps_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "new").touch()
    (b / "old").touch()
    if not writer._exchange(a, b):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here: the two-step swap with recovery is used")
    assert (a / "old").exists() and (b / "new").exists()


def _disk_full_after_first_file(monkeypatch):
    real_save = writer.save_file

    def save_until_full(tensors, path, metadata=None):
        if any(Path(path).parent.glob("*.safetensors")):
            Path(path).write_bytes(b"\0" * 100)  # the partial file a full disk leaves
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr(writer, "save_file", save_until_full)


@pytest.mark.parametrize("with_old", [False, True], ids=["fresh", "force-over-old"])
def test_disk_full(stock_checkpoint, old_dst, tmp_path, monkeypatch, with_old):
    src = stock_checkpoint("roberta", "RobertaForMaskedLM")
    dst, before = old_dst
    if not with_old:
        dst = tmp_path / "fresh"
    _disk_full_after_first_file(monkeypatch)
    with pytest.raises(ConversionError, match="No space left on device") as err:
        fivefold.convert(src, dst, max_shard_size="20KB", force=with_old, progress=False)
    assert str(dst) in str(err.value)
    assert ("old one is unchanged" if with_old else "nothing was written") in str(err.value)
    stderr = io.StringIO()
    with redirect_stderr(stderr), redirect_stdout(io.StringIO()):
        code = cli.main(["convert", str(src), str(dst), "--max-shard-size", "20KB", *(["--force"] * with_old)])
    assert code == 2 and "No space left on device" in stderr.getvalue()
    if with_old:
        assert _snapshot(dst) == before
    else:
        assert not dst.exists()
    assert _leftovers(dst) == []


def test_export_disk_full(converted, tmp_path, monkeypatch):
    _, ours = converted("bert", "BertForMaskedLM")
    _disk_full_after_first_file(monkeypatch)
    with pytest.raises(ConversionError, match="No space left on device"):
        fivefold.export(ours, tmp_path / "out", max_shard_size="20KB", progress=False)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path / "out") == []


def test_interrupt_during_write_leaves_nothing(stock_checkpoint, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "save_file", interrupted)
    dst = tmp_path / "dst"
    with pytest.raises(KeyboardInterrupt):
        fivefold.convert(stock_checkpoint("bert", "BertForMaskedLM"), dst, progress=False)
    assert not dst.exists() and _leftovers(dst) == []


def test_leftovers_of_a_running_conversion_are_left_alone(stock_checkpoint, tmp_path):
    dst = tmp_path / "dst"
    running = tmp_path / f".dst.tmp-{os.getppid()}-abc"  # a live process (our parent) owns it
    running.mkdir()
    foreign = tmp_path / ".dst.tmp-notours"
    foreign.mkdir()
    fivefold.convert(stock_checkpoint("bert", "BertForMaskedLM"), dst, progress=False)
    assert running.is_dir() and foreign.is_dir()


def test_force_over_a_symlink_replaces_the_link_not_its_target(stock_checkpoint, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("not to be deleted")
    dst = tmp_path / "dst"
    dst.symlink_to(target)
    with pytest.raises(ConversionError, match="already exists"):
        fivefold.convert(stock_checkpoint("bert", "BertForMaskedLM"), dst, progress=False)
    fivefold.convert(stock_checkpoint("bert", "BertForMaskedLM"), dst, force=True, progress=False)
    assert not dst.is_symlink() and (dst / "model.safetensors").is_file()
    assert (target / "keep.txt").read_text() == "not to be deleted"
    assert _leftovers(dst) == []
