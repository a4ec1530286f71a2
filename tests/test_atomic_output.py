"""Conversion output is all or nothing: a run killed halfway, a disk that fills up or an interrupted swap over
an old DST leaves DST absent or the old DST intact, and no temporary folder survives the next run."""

import errno
import io
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

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
    import os, sys, time
    import fivefold
    from fivefold.conversion import writer

    src, dst, marker, force = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    real_save = writer.save_file

    def save_then_hang(tensors, path, metadata=None, **layout):
        real_save(tensors, path, metadata=metadata, **layout)
        with open(marker + ".part", "w") as f:  # renamed whole: the parent never reads a half-written marker
            f.write(path)
        os.replace(marker + ".part", marker)
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

    def save_until_full(tensors, path, metadata=None, **layout):
        if any(Path(path).parent.glob("*.safetensors")):
            Path(path).write_bytes(b"\0" * 100)  # the partial file a full disk leaves
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_save(tensors, path, metadata=metadata, **layout)

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


# --- races and self-overwrites: DST appearing mid-write, DST overlapping SRC, DST that cannot be written -------


def _block_writer_then(monkeypatch, action):
    """Stops the writer at a known point (its first shard, before the swap), runs `action` there, goes on."""
    real_save = writer.save_file
    fired = []

    def save_then_act(tensors, path, metadata=None, **layout):
        real_save(tensors, path, metadata=metadata, **layout)
        if not fired:
            fired.append(path)
            action()

    monkeypatch.setattr(writer, "save_file", save_then_act)
    return fired


def test_destination_created_during_the_write_is_left_alone(stock_checkpoint, tmp_path, monkeypatch):
    src, dst = stock_checkpoint("bert", "BertForMaskedLM"), tmp_path / "dst"

    def user_creates_dst():
        dst.mkdir()
        (dst / "mine.txt").write_text("the user's")

    assert _block_writer_then(monkeypatch, user_creates_dst) == []
    with pytest.raises(ConversionError, match="appeared while this conversion was writing") as err:
        fivefold.convert(src, dst, progress=False)
    assert "left untouched" in str(err.value) and "\n" not in str(err.value)
    assert _snapshot(dst) == {"mine.txt": b"the user's"}
    assert _leftovers(dst) == []


def test_two_concurrent_conversions_without_force(stock_checkpoint, tmp_path, monkeypatch):
    """The second conversion to finish refuses; the first one's output stays, byte for byte."""
    src, dst = stock_checkpoint("bert", "BertForMaskedLM"), tmp_path / "dst"
    first = {}

    def another_conversion_finishes():
        monkeypatch.setattr(writer, "save_file", real_save)
        fivefold.convert(stock_checkpoint("roberta", "RobertaForMaskedLM"), dst, progress=False)
        first.update(_snapshot(dst))

    real_save = writer.save_file
    _block_writer_then(monkeypatch, another_conversion_finishes)
    with pytest.raises(ConversionError, match="appeared while this conversion was writing"):
        fivefold.convert(src, dst, progress=False)
    assert first and _snapshot(dst) == first
    assert b"fivefold_roberta" in first["config.json"]
    assert _leftovers(dst) == []


@pytest.mark.parametrize(
    ("where", "message"),
    [("same", "is the source folder"), ("inside", "lies inside the source folder"), ("above", "holds the source")],
)
@pytest.mark.parametrize("command", ["convert", "export"])
def test_destination_overlapping_the_source_is_refused(stock_checkpoint, converted, tmp_path, where, message, command):
    """DST equal to, inside or above SRC is refused before anything is written, --force or not."""
    origin = stock_checkpoint("bert", "BertForMaskedLM") if command == "convert" else converted("bert", "BertModel")[1]
    parent = tmp_path / "parent"
    src = parent / "src"
    shutil.copytree(origin, src)
    (parent / "other.txt").write_text("the user's other file")
    before = {p.relative_to(parent): p.read_bytes() for p in sorted(parent.rglob("*")) if p.is_file()}
    dst = {"same": src, "inside": src / "out", "above": parent}[where]
    for force in (False, True):
        if where != "inside" and not force:
            continue  # an existing DST without --force: "already exists"
        with pytest.raises(ConversionError, match=message):
            getattr(fivefold, command)(src, dst, force=force, progress=False)
        code, stderr = _cli_in_process(command, src, dst, *(["--force"] * force))
        assert code == 2 and message in stderr and "Traceback" not in stderr
    after = {p.relative_to(parent): p.read_bytes() for p in sorted(parent.rglob("*")) if p.is_file()}
    assert after == before


def _cli_in_process(*args) -> tuple[int, str]:
    stderr = io.StringIO()
    with redirect_stderr(stderr), redirect_stdout(io.StringIO()):
        code = cli.main([str(a) for a in args])
    return code, stderr.getvalue()


UNWRITABLE = {
    "parent-is-a-file": ("{tmp}/a-file/dst", "is a file, not a folder"),
    "under-proc": ("/proc/fivefold-test/dst", "No such file or directory"),
    "under-sys": ("/sys/fivefold-test/dst", "Operation not permitted"),
    "parent-read-only": ("{tmp}/read-only/dst", "Permission denied"),
}


@pytest.mark.parametrize("case", UNWRITABLE)
def test_destination_that_cannot_be_written(stock_checkpoint, tmp_path, case):
    pattern, reason = UNWRITABLE[case]
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "read-only").mkdir(mode=0o555)
    if case == "parent-read-only" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; /proc and /sys cover refusals root meets too")
    if case.startswith("under-") and not Path(f"/{case[6:]}").is_dir():
        pytest.skip(f"no /{case[6:]} here")
    dst = Path(pattern.format(tmp=tmp_path))
    code, stderr = _cli_in_process("convert", stock_checkpoint("bert", "BertForMaskedLM"), dst)
    assert code == 2, stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert f"cannot write {dst}" in stderr and reason in stderr


# --- save_pretrained: the same atomic swap -------------------------------------------------------------------


@pytest.fixture
def saved(converted, tmp_path):
    """A model saved into a folder that also holds the user's tokenizer file and a subfolder."""
    _, ours = converted("bert", "BertForMaskedLM")
    model = fivefold.FivefoldBertForMaskedLM.from_pretrained(ours)
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "vocab.txt").write_text("[PAD]\n")
    (folder / "runs").mkdir()
    (folder / "runs" / "log.txt").write_text("epoch 1")
    model.save_pretrained(folder)
    return model, folder


def _tree(folder: Path) -> dict[Path, bytes]:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_save_pretrained_interrupted_keeps_the_old_folder(saved, monkeypatch):
    import transformers.modeling_utils

    model, folder = saved
    before = _tree(folder)
    assert Path("vocab.txt") in before and Path("runs/log.txt") in before and Path("model.safetensors") in before

    def killed_mid_write(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)  # half a file
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", killed_mid_write)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        model.save_pretrained(folder)
    assert _tree(folder) == before
    assert _leftovers(folder) == []
    monkeypatch.undo()
    model.save_pretrained(folder)  # a complete save replaces the weights and keeps the user's files
    assert (folder / "vocab.txt").read_text() == "[PAD]\n" and (folder / "runs" / "log.txt").read_text() == "epoch 1"
    assert (folder / "model.safetensors").read_bytes() != before[Path("model.safetensors")]
    assert _leftovers(folder) == []


SAVE_KILLED_MID_WRITE = textwrap.dedent(
    """
    import os, sys, time
    import fivefold, transformers.modeling_utils as mu

    src, folder, marker = sys.argv[1:4]
    model = fivefold.FivefoldBertForMaskedLM.from_pretrained(src)
    real_save = mu.safe_save_file

    def save_then_hang(tensors, filename, metadata=None):
        real_save(tensors, filename, metadata=metadata)
        with open(marker + ".part", "w") as f:
            f.write(filename)
        os.replace(marker + ".part", marker)
        time.sleep(600)

    mu.safe_save_file = save_then_hang
    model.save_pretrained(folder, max_shard_size="20KB")
    """
)


@pytest.mark.slow
def test_save_pretrained_killed_mid_write(saved, converted, tmp_path):
    _, folder = saved
    before = _tree(folder)
    marker = tmp_path / "first-shard-written"
    proc = _run_until(SAVE_KILLED_MID_WRITE, [converted("bert", "BertForMaskedLM")[1], folder, marker], marker)
    assert Path(marker.read_text()).parent.name.startswith(f".{folder.name}.tmp-")  # written beside, not into
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert _tree(folder) == before


def test_working_directory_is_never_swapped_out(saved, stock_checkpoint, monkeypatch):
    """Swapping the folder a process stands in would leave it in a deleted folder: `save_pretrained(".")` writes
    in place, and `convert SRC . --force` is refused."""
    model, folder = saved
    monkeypatch.chdir(folder)
    model.save_pretrained(".")
    assert {"vocab.txt", "runs", "model.safetensors", "config.json"} <= set(os.listdir("."))
    with pytest.raises(ConversionError, match="holds the working directory"):
        fivefold.convert(stock_checkpoint("bert", "BertForMaskedLM"), ".", force=True, progress=False)
    assert (Path.cwd() / "vocab.txt").read_text() == "[PAD]\n"
