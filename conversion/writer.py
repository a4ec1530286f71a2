"""Writing checkpoints atomically: everything goes to a temporary folder beside the destination, which is renamed
into place only when complete (see `atomic_folder` for what an interrupted run leaves)."""

import ctypes
import errno
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .errors import CheckpointWarning, ConversionError
from .reader import _SAFE_DTYPES, SAFE_INDEX, SAFE_SINGLE
from .space import check_space, folder_bytes, is_full, needs_and_has


def parse_size(size: int | str) -> int:
    """'5GB' -> bytes (decimal units as transformers uses; also KiB/MiB/GiB)."""
    if isinstance(size, int):
        return size
    text = size.strip().upper()
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9,
             "TB": 10**12, "B": 1}  # fmt: skip
    for unit, factor in units.items():
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * factor)
            except ValueError:
                break
    try:
        return int(text)
    except ValueError:
        raise ConversionError(f"cannot read size {size!r}: use e.g. 500MB, 5GB or a byte count") from None


def plan_shards(sizes: list[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """Greedy, in order: a new shard starts when the next tensor would overflow the current one."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes:
        if shards[-1] and used + size > max_shard_size:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def write_safetensors(
    folder: Path,
    sizes: list[tuple[str, int]],
    materialize: Callable[..., dict[str, torch.Tensor]],  # (keys, done(bytes) per tensor) -> tensors
    max_shard_size: int,
    progress: bool = True,
    aligned: bool = True,
) -> list[str]:
    """Writes one shard at a time (peak memory: one shard), with an index when there is more than one; `aligned` as
    `save_file`'s."""
    shards = plan_shards(sizes, max_shard_size)
    names = (
        [SAFE_SINGLE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    # Each byte counts twice: once read, checked and mapped (tensor by tensor), once written (shard by shard).
    total = 2 * sum(s for _, s in sizes)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="reading, checking, writing", disable=not progress)
    weight_map = {}
    try:
        for file, keys in zip(names, shards, strict=True):
            tensors = {k: t.contiguous() for k, t in materialize(keys, bar.update).items()}
            _unshare(tensors)
            nbytes = sum(_nbytes(t) for t in tensors.values())
            save_file(tensors, str(folder / file), metadata={"format": "pt"}, aligned=aligned)
            bar.update(nbytes)
            weight_map.update(dict.fromkeys(keys, file))
            del tensors
    finally:
        bar.close()  # before any error is printed: the message on a line of its own, the bar not redrawn after it
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(s for _, s in sizes)}, "weight_map": weight_map}
        (folder / SAFE_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names


_SAFE_NAMES = {dtype: name for name, dtype in _SAFE_DTYPES.items()}


def save_file(
    tensors: dict[str, torch.Tensor], filename: str | os.PathLike, metadata: dict[str, str], aligned: bool = True
) -> None:
    """safetensors' `save_file`, streamed: writes `tensors` (contiguous, CPU) as one safetensors file, each straight
    from its memory and dropped from the dict once written, so that writing a shard needs no second copy of it
    (safetensors' own builds one: the bytes of every tensor at once).

    `aligned`: every tensor whose size allows it starts on a 64-byte boundary, as torch aligns what it allocates
    (those of a multiple of 64 bytes first, then the rest widest dtype first), so that a memory-mapped tensor runs
    the kernels its copy would, and a model with offloaded experts keeps it mapped, uncopied
    (modeling/owned_memory.py). Otherwise safetensors' own layout (by dtype then name, the data 8-byte aligned), so
    that a stock folder written again is read at the same addresses as the one safetensors wrote: transformers
    computes on the mapped weights, and oneDNN sums a product in another order on differently aligned data."""
    unit = 64 if aligned else 8
    order = sorted(
        tensors, key=lambda name: (aligned and _nbytes(tensors[name]) % 64 > 0, -tensors[name].element_size(), name)
    )
    header, offset = {"__metadata__": metadata}, 0
    for name in order:
        t = tensors[name]
        header[name] = {
            "dtype": _SAFE_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + _nbytes(t)],
        }
        offset += _nbytes(t)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-(8 + len(encoded)) % unit)  # the format allows any padding of spaces
    try:
        with open(filename, "wb") as f:
            f.write(len(encoded).to_bytes(8, "little"))
            f.write(encoded)
            for name in order:
                t = tensors.pop(name)
                if t.numel():
                    f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
                del t
    except OSError as e:
        if e.filename is None:  # a failed write() names no file: the message should
            raise OSError(e.errno, e.strerror, str(filename)) from e
        raise


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _unshare(tensors: dict[str, torch.Tensor]) -> None:
    # safetensors refuses tensors sharing storage (chunks of one fused tensor); give each its own.
    seen: set[int] = set()
    for name, t in tensors.items():
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or t.untyped_storage().nbytes() != _nbytes(t):
            tensors[name] = t.clone()
        seen.add(ptr)


def check_destination(dst: str | os.PathLike, force: bool) -> Path:
    # Absolute, so that "." or "x/.." has a real name and parent to write beside; a symlink is not followed.
    dst = Path(os.path.abspath(dst))
    try:
        recover_destination(dst)
    except OSError as e:
        raise _cannot_write(dst, e) from None
    if (dst.exists() or dst.is_symlink()) and not force:
        raise ConversionError(f"{dst} already exists (use --force / force=True to replace it)")
    if holds_working_directory(dst):
        raise ConversionError(f"{dst} holds the working directory: replacing it would leave this process in a "
                              "deleted folder; write the conversion elsewhere")  # fmt: skip
    return dst


def holds_working_directory(folder: Path) -> bool:
    """Whether replacing `folder` would delete the directory this process stands in (a symlink is replaced, not
    its target)."""
    if not folder.exists() or folder.is_symlink():
        return False
    here = Path.cwd().resolve()
    return folder.resolve() == here or folder.resolve() in here.parents


def check_apart(src: Path, dst: Path) -> None:
    """DST may be neither SRC, nor inside it, nor above it: replacing DST would delete the source, or the
    output would land among the files being read."""
    source, target = src.resolve(), dst.resolve()
    if target == source:
        raise ConversionError(f"{dst} is the source folder {src}: write the conversion elsewhere")
    if source in target.parents:
        raise ConversionError(f"{dst} lies inside the source folder {src}: write the conversion elsewhere")
    if target in source.parents:
        raise ConversionError(f"{dst} holds the source folder {src}: replacing it would delete the source")


def _cannot_write(dst: Path, e: OSError, kept: str = "nothing was written there", space: str = "") -> ConversionError:
    where = f" ({e.filename})" if e.filename else ""
    space = f"; {space}" if space else ""
    return ConversionError(f"cannot write {dst}: {e.strerror or e}{where}{space}; {kept}")


def _make_parent(dst: Path) -> None:
    for folder in (dst.parent, *dst.parent.parents):
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                raise ConversionError(f"cannot write {dst}: {folder} is a file, not a folder")
            break
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cannot_write(dst, e) from None


# Work folders beside DST carry the writing process's id, so that a later run can tell a dead run's leftovers
# (removed) from a running conversion's (left alone).
def _tmp_prefix(dst: Path) -> str:
    return f".{dst.name}.tmp-"


def _aside_prefix(dst: Path) -> str:
    return f".{dst.name}.old-"


def _owner_alive(name: str, prefix: str) -> bool:
    pid = name[len(prefix) :].split("-")[0]
    if not pid.isdigit():
        return True  # not named by us: never touched
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def recover_destination(dst: Path) -> None:
    """Cleans up after a conversion to `dst` that was killed: its temporary folder is removed, and an old `dst`
    moved aside by an interrupted replacement (only where the atomic exchange is unavailable) is put back."""
    if not dst.parent.is_dir():
        return
    for entry in sorted(dst.parent.iterdir()):
        for prefix in (_aside_prefix(dst), _tmp_prefix(dst)):
            if not entry.name.startswith(prefix) or _owner_alive(entry.name, prefix):
                continue
            if prefix == _aside_prefix(dst) and not (dst.exists() or dst.is_symlink()):
                os.replace(entry, dst)
                warnings.warn(f"restored {dst} from an interrupted replacement", CheckpointWarning, stacklevel=3)
            else:
                _remove(entry)


def _remove(path: Path) -> None:
    """Removes what an old DST was: a folder, a file or a symlink (never what a symlink points to)."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where that is unavailable."""
    return _renameat2(a, b, flags=2)


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """Linux renameat2 with `flags`; False where the call or the flag is unavailable, OSError on failure."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _move_to_new(tmp: Path, dst: Path) -> None:
    """tmp becomes dst only if nothing is at dst: a folder or a conversion's output that appeared there while
    this one was writing (after check_destination looked) is never replaced without --force."""
    appeared = ConversionError(
        f"{dst} appeared while this conversion was writing; it was left untouched and this output discarded "
        "(use --force / force=True to replace it)"
    )
    try:
        if _renameat2(tmp, dst, flags=1):  # RENAME_NOREPLACE: fails with EEXIST if dst exists
            return
        if dst.exists() or dst.is_symlink():  # elsewhere: check, then a rename that fails over a non-empty dst
            raise appeared
        os.rename(tmp, dst)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise appeared from None
        raise


def _put_in_place(tmp: Path, dst: Path, force: bool) -> None:
    if not force:
        _move_to_new(tmp, dst)
    elif not (dst.exists() or dst.is_symlink()):
        os.replace(tmp, dst)
    elif _exchange(tmp, dst):
        # dst was complete (old) before this instant and complete (new) after it; tmp now holds the old one.
        _remove(tmp)
    else:
        # Two renames: killed between them, dst is absent for a moment but the old one waits aside under our
        # pid, and the next run to dst (recover_destination) puts it back.
        aside = dst.with_name(f"{_aside_prefix(dst)}{os.getpid()}")
        os.replace(dst, aside)
        try:
            os.replace(tmp, dst)
        except BaseException:
            os.replace(aside, dst)
            raise
        _remove(aside)


@contextmanager
def atomic_folder(dst: Path, force: bool, needed: int | None = None) -> Iterator[Path]:
    """Yields a temporary folder beside `dst`; on success it replaces `dst`, on failure it vanishes. Given the
    bytes the write `needed` (at least), it is refused before anything is written where the file system says
    they do not fit.

    At every instant `dst` is either absent (if it was), the old folder, or the complete new one: the swap over
    an old `dst` is one atomic exchange on Linux. A run killed outright (SIGKILL, power loss) cannot clean up
    after itself; the next conversion to the same `dst` removes what it left behind.
    """
    dst = check_destination(dst, force)
    _make_parent(dst)
    free = check_space(dst, needed)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{_tmp_prefix(dst)}{os.getpid()}-", dir=dst.parent))
    except OSError as e:  # read-only, /proc, /sys
        raise _cannot_write(dst, e) from None
    try:
        # mkdtemp makes the folder private (0700); the result should have the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        try:
            yield tmp
            _put_in_place(tmp, dst, force)
        except OSError as e:  # disk full, quota, permissions: the user's to fix, not a crash
            kept = "the old one is unchanged" if dst.exists() else "nothing was written there"
            space = ""
            if is_full(e):
                space = f"{needs_and_has(max(needed or 0, folder_bytes(tmp)), free, dst.parent)} when it started"
            raise _cannot_write(dst, e, kept, space) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
