"""A memory cgroup of a benchmark's own, for a contender's process: its limit counts the page cache too, so reads
that the limit pushes out of it really reach the disk, and its peak charge is the contender's memory figure. And
the disk-side helpers such measurements need: a cold page cache, the disk's bandwidth, a process's bytes read."""

import os
import time
from pathlib import Path


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes")).split()[1])


class MemoryCgroup:
    """A memory cgroup of its own (v1 `/sys/fs/cgroup/memory`, else v2), its limit and its peak charge."""

    def __init__(self, name: str, limit: int | None):
        v1 = Path("/sys/fs/cgroup/memory")
        self.v1 = v1.is_dir()
        self.path = (v1 if self.v1 else Path("/sys/fs/cgroup")) / name
        self.path.mkdir()
        if limit is not None:
            (self.path / ("memory.limit_in_bytes" if self.v1 else "memory.max")).write_text(str(limit))

    def peak(self) -> int:
        return int((self.path / ("memory.max_usage_in_bytes" if self.v1 else "memory.peak")).read_text())

    def oom_kills(self) -> int:
        """How many of its processes the kernel's OOM killer ended at the limit."""
        name = "memory.oom_control" if self.v1 else "memory.events"
        lines = (self.path / name).read_text().splitlines()
        return next((int(line.split()[1]) for line in lines if line.startswith("oom_kill ")), 0)

    def remove(self) -> None:
        self.path.rmdir()


def cgroups_available() -> bool:
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    usable = Path("/sys/fs/cgroup/memory").is_dir() or (v2.exists() and "memory" in v2.read_text())
    return os.geteuid() == 0 and usable


def drop_from_page_cache(folder: Path) -> None:
    """The checkpoint's pages out of the page cache, so that the contender's reads start from the disk."""
    for file in folder.rglob("*.safetensors"):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_bandwidth(folder: Path) -> float:
    """Bytes a second of a cold sequential read of the checkpoint's largest file."""
    file = max(folder.rglob("*.safetensors"), key=lambda p: p.stat().st_size)
    drop_from_page_cache(folder)
    start, size = time.perf_counter(), 0
    with open(file, "rb", buffering=0) as f:
        while chunk := f.read(1 << 24):
            size += len(chunk)
    return size / (time.perf_counter() - start)
