"""Disk space: a write checks, before it starts, that the file system says it has room for what it will write,
and a write that runs out of room anyway (other writers, quotas, compression) says how much it needed and how
much there was."""

import errno
import os
import shutil
from pathlib import Path

from .errors import ConversionError

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def human_size(nbytes: int) -> str:
    """1234567 -> '1.2 MB' (decimal units, as `df -H` and the Hub show sizes)."""
    size = float(nbytes)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def free_bytes(folder: Path) -> int | None:
    """What the file system holding `folder` says is free for this user; None where it does not say."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def needs_and_has(needed: int | None, free: int | None, where: Path) -> str:
    """'it needs at least 1.2 MB; 0.5 MB were free on /data' (only the parts that are known)."""
    parts = []
    if needed is not None:
        parts.append(f"it needs at least {human_size(needed)}")
    if free is not None:
        parts.append(f"{human_size(free)} were free on {where}")
    return "; ".join(parts)


def check_space(dst: Path, needed: int | None) -> int | None:
    """Refuses a write of `needed` bytes beside `dst` that the file system already says cannot fit; returns the
    free bytes it saw (for the message of a write that runs out anyway)."""
    free = free_bytes(dst.parent)
    if needed is not None and free is not None and needed > free:
        raise ConversionError(
            f"not enough space to write {dst}: {needs_and_has(needed, free, dst.parent)}; nothing was written there"
        )
    return free


def is_full(e: OSError) -> bool:
    return e.errno in _FULL


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under `folder` (what a failed write had written when it stopped)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total
