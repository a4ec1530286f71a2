"""Where an offloaded expert's tensors are read from: a tensor of a safetensors file (the checkpoint folder itself,
or an offload folder transformers wrote at load), or a tensor held in CPU memory.

A file is opened by its path at every read and its header checked against what it held when the model was loaded,
so that a checkpoint deleted, truncated or rewritten under a running model is a clear error naming the file, never
a crash on a dead memory map or weights silently different from those the model was loaded with. Reads go through
`readinto` or `preadv` (no memory map kept), which release the GIL: a background thread can read while the model
computes.

A tensor read for the expert cache may bypass the page cache (`direct`: O_DIRECT, whole pages into a page-aligned
buffer, the tensor a view into it). Under a memory limit that counts the page cache (a cgroup, a small machine),
a cached expert read through the page cache is held twice, once by the cache and once by the page cache, and every
miss first has the kernel reclaim pages for its read: the reduced Mixtral of benchmarks/offload.py at a quarter of
its experts resident decoded 7.2-7.6 tokens/s through the page cache and 9.4-9.5 reading directly (Zen 4).
A file system that refuses O_DIRECT (tmpfs before Linux 6.6, ext4 with data=journal) is read through the page
cache; tensors under 1 MiB always are.
"""

import ctypes
import errno
import json
import mmap
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip


_OWN_PAGES = 1 << 20  # bytes from which a read buffer gets pages of its own
_ALIGN = 64  # bytes: what torch gives what it allocates, and its int8 kernel asks of its data
_PAGE = mmap.PAGESIZE  # the alignment O_DIRECT asks of offsets, sizes and buffers (a multiple of the block size)


class ExpertReadError(RuntimeError):
    """An offloaded expert's tensor could not be read back from the file it was loaded from."""


@dataclass(frozen=True)
class TensorEntry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # from the start of the file
    nbytes: int


def read_header(path: str | os.PathLike) -> dict[str, TensorEntry]:
    """The tensors a safetensors file holds, by name, with where their bytes lie."""
    with open(path, "rb") as f:
        return _parse_header(f, path)


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata a safetensors file holds beside its tensors (a quantizer's description of them)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)).get("__metadata__") or {}


def _parse_header(f, path) -> dict[str, TensorEntry]:
    size = os.fstat(f.fileno()).st_size
    head = f.read(8)
    if len(head) < 8:
        raise ExpertReadError(f"{path} is not a safetensors file (it has {size} bytes)")
    (length,) = struct.unpack("<Q", head)
    if 8 + length > size:
        raise ExpertReadError(f"{path} is truncated: its header says {length} bytes, the file has {size}")
    raw = f.read(length)
    with _PARSED_LOCK:  # the prefetcher's thread reads files too
        seen = _PARSED.get(str(path))
        if seen is not None and seen[0] == raw:
            _PARSED.move_to_end(str(path))
            return seen[1]
    header = json.loads(raw)
    header.pop("__metadata__", None)
    entries = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if info["dtype"] not in _DTYPES:
            raise ExpertReadError(f"{path}: tensor {name} has dtype {info['dtype']}, which fivefold cannot read")
        entries[name] = TensorEntry(_DTYPES[info["dtype"]], tuple(info["shape"]), 8 + length + begin, end - begin)
    with _PARSED_LOCK:
        _PARSED[str(path)] = (raw, entries)
        while len(_PARSED) > _PARSED_FILES:
            _PARSED.popitem(last=False)
    return entries


# The last header parsed of each file, as read and as parsed: a read checks the file's header at every call, and a
# header read again unchanged is not parsed again (a quantized expert reads nine tensors, and parsing the header of
# a large checkpoint takes milliseconds).
_PARSED: OrderedDict[str, tuple[bytes, dict[str, TensorEntry]]] = OrderedDict()
_PARSED_FILES = 256  # the most recently read files remembered (a checkpoint's shards, a few models')
_PARSED_LOCK = threading.Lock()


class FileTensor:
    """One tensor of a safetensors file, read on demand."""

    def __init__(self, path: str | os.PathLike, name: str, entry: TensorEntry | None = None):
        self.path, self.name = str(path), name
        self.entry = entry if entry is not None else self._entry_in(read_header(path))
        self.nbytes = self.entry.nbytes  # the bytes a read takes from the file
        self.direct = False  # set by the expert cache: reads of large tensors bypass the page cache
        self.aligned = False  # set for a kernel that needs its data on a 64-byte boundary (int8.py)

    @property
    def capacity(self) -> int:
        """The bytes a read buffer of this tensor holds: for a direct read, the whole pages around it wherever it
        lies in its file (so that one buffer serves every tensor of its size)."""
        if not self.direct or self.nbytes < _OWN_PAGES:
            return self.nbytes
        return -(-self.nbytes // _PAGE) * _PAGE + _PAGE

    def _entry_in(self, header: dict[str, TensorEntry]) -> TensorEntry:
        if self.name not in header:
            raise ExpertReadError(f"{self.path} no longer holds tensor {self.name}: the checkpoint changed")
        return header[self.name]

    def empty(self, pin_memory: bool = False) -> torch.Tensor:
        """A buffer for `read(into=...)`, allocated by the calling thread (a reading thread allocates nothing): pinned
        memory for an accelerator; else, for a large tensor, pages of its own (an anonymous mmap, huge pages where
        the system gives them), returned to the system when the tensor is freed. From malloc, glibc keeps such
        blocks once freed (its mmap threshold rises to the largest freed): a cache reading and evicting experts
        then grew the process by hundreds of MB over its budget, OOM-killed at the benchmark's cgroup limit."""
        if pin_memory or self.nbytes < _OWN_PAGES:
            return torch.empty(self.capacity, dtype=torch.uint8, pin_memory=pin_memory)
        pages = mmap.mmap(-1, self.capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            pages.madvise(mmap.MADV_HUGEPAGE)
        return torch.frombuffer(pages, dtype=torch.uint8)

    def read(self, pin_memory: bool = False, into: torch.Tensor | None = None) -> torch.Tensor:
        try:
            with open(self.path, "rb") as f:
                if self._entry_in(_parse_header(f, self.path)) != self.entry:
                    raise ExpertReadError(
                        f"{self.path} changed since the model was loaded: tensor {self.name} is no longer where it was"
                    )
                if os.fstat(f.fileno()).st_size < self.entry.offset + self.nbytes:
                    raise ExpertReadError(f"{self.path} is truncated: tensor {self.name} lies past its end")
                out = self.empty(pin_memory) if into is None else into
                skip, got = self._read_direct(f, out) if self._reads_directly(out) else (0, None)
                if got is None:
                    f.seek(self.entry.offset)
                    got = f.readinto(memoryview(out[: self.nbytes].numpy()))
        except FileNotFoundError as error:
            raise ExpertReadError(
                f"{self.path} was removed while the model uses it: offloaded experts are read from it at every miss"
            ) from error
        except (OSError, ValueError) as error:  # ValueError: a header that is not JSON
            raise ExpertReadError(f"reading tensor {self.name} from {self.path} failed: {error}") from error
        if got != self.nbytes:
            raise ExpertReadError(f"{self.path} is truncated: tensor {self.name} lies past its end")
        if self.aligned and skip % _ALIGN:
            skip = _moved_back(out, skip, self.nbytes)
        return out[skip : skip + self.nbytes].view(self.entry.dtype).reshape(self.entry.shape)

    def _reads_directly(self, out: torch.Tensor) -> bool:
        return (
            self.direct
            and self.nbytes >= _OWN_PAGES
            and out.numel() >= self.capacity
            and out.data_ptr() % _PAGE == 0
            and self.entry.offset % self.entry.dtype.itemsize == 0
        )

    def _read_direct(self, f, out: torch.Tensor) -> tuple[int, int | None]:
        """Reads the whole pages holding the tensor into `out`, bypassing the page cache, from the file `f` has open
        (whose header was checked): (where the tensor starts in `out`, its bytes read); (0, None) where the file
        system refuses O_DIRECT."""
        start = self.entry.offset // _PAGE * _PAGE
        skip = self.entry.offset - start
        size = -(-(skip + self.nbytes) // _PAGE) * _PAGE
        view, done, fd = memoryview(out.numpy())[:size], 0, None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            opened, checked = os.fstat(fd), os.fstat(f.fileno())
            if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino):
                raise ExpertReadError(
                    f"{self.path} changed since the model was loaded: it was replaced while tensor {self.name} was read"
                )
            while done < size:  # short only at the end of the file
                got = os.preadv(fd, [view[done:]], start + done)
                done += max(got, 0)
                if got <= 0 or got % _PAGE:
                    break
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            self.direct = False
            return 0, None
        finally:
            if fd is not None:
                os.close(fd)
        return skip, min(max(done - skip, 0), self.nbytes)


def _moved_back(out: torch.Tensor, skip: int, nbytes: int) -> int:
    """Moves `nbytes` at `skip` in `out` back to the 64-byte boundary below; where they now start. A direct read
    puts a tensor where it lies within its first page, and safetensors aligns tensors to 8 bytes only."""
    start = skip - skip % _ALIGN
    ctypes.memmove(out.data_ptr() + start, out.data_ptr() + skip, nbytes)  # overlapping: memmove, not a copy
    return start


class MemoryTensor:
    """A tensor already in CPU memory (an expert placed on "cpu" while the model runs on an accelerator)."""

    nbytes = capacity = 0  # nothing is read from a disk

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def empty(self, pin_memory: bool = False) -> None:
        return None

    def read(self, pin_memory: bool = False, into: None = None) -> torch.Tensor:
        return self.tensor


def index_files(files: list[Path]) -> tuple[dict[str, FileTensor], dict[str, str]]:
    """Every tensor of these safetensors files, by name, and their metadata merged (for the experts a device map
    placed on the execution device, which the cache may evict and read back later, and those a quantized checkpoint
    leaves on "disk")."""
    tensors, metadata = {}, {}
    for file in files:
        for name, entry in read_header(file).items():
            tensors.setdefault(name, FileTensor(file, name, entry))
        metadata.update(read_metadata(file))
    return tensors, metadata


def folder_files(folders: set[Path]) -> list[Path]:
    """The weight files of these folders: those a checkpoint's index names, or its `model.safetensors`; any
    safetensors file only in a folder that is neither (an offload folder). A stray file beside a checkpoint (a stale
    shard, another variant) is never read for it."""
    files = []
    for folder in sorted(folders):
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            files += [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        elif (folder / "model.safetensors").is_file():
            files.append(folder / "model.safetensors")
        else:
            files += sorted(folder.glob("*.safetensors"))
    return files
