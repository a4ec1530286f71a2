"""Reading checkpoints safely and writing them atomically.

Reading: safetensors first; `.bin` only through `torch.load(weights_only=True)`; shard indexes may only name
files inside the checkpoint folder. Writing: everything goes to a temporary folder beside the destination,
which is renamed into place only when complete (see `atomic_folder` for what an interrupted run leaves).
"""

import ctypes
import errno
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from .errors import CheckpointWarning, ConversionError

SAFE_SINGLE, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN_SINGLE, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"

_SAFE_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


def read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConversionError(f"{path} not found") from None
    except OSError as e:
        raise ConversionError(f"cannot read {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConversionError(f"{path} must hold a JSON object")
    return data


def allowed_roots(folder: Path) -> list[Path]:
    """Where the files of a checkpoint folder may really live: the folder itself and, for a Hub cache snapshot
    (`.../snapshots/<revision>`, whose files are symlinks into the repo's `blobs/`), that blob store."""
    root = folder.resolve()
    roots = [root]
    if folder.parent.name == "snapshots":
        roots.append((folder.parent.parent / "blobs").resolve())
    return roots


def inside(path: Path, roots: list[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved == root or root in resolved.parents for root in roots)


def shard_path(folder: Path, name: object, index_file: str) -> Path:
    """The shard file an index names, refusing anything that would leave the folder."""
    if not isinstance(name, str) or not name or "\\" in name:
        raise ConversionError(f"{index_file} names an invalid shard file {name!r}")
    if Path(name).is_absolute():
        raise ConversionError(f"{index_file} names {name!r}, an absolute path outside the checkpoint folder {folder}")
    path = folder / name
    if not inside(path, allowed_roots(folder)):
        raise ConversionError(f"{index_file} names {name!r}, which lies outside the checkpoint folder {folder}")
    if not path.is_file():
        raise ConversionError(f"{index_file} names {name!r}, which does not exist in {folder}")
    return path


class CheckpointReader:
    """Lazy access to the tensors of one checkpoint folder, by name."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self._file_of: dict[str, Path] = {}
        self._handles: dict[Path, object] = {}
        self._bin: dict[Path, dict[str, torch.Tensor]] = {}
        for file in self._weight_files():
            for key in self._keys_in(file):
                if key in self._file_of:
                    raise ConversionError(f"tensor {key!r} appears in both {self._file_of[key].name} and {file.name}")
                self._file_of[key] = file

    def _weight_files(self) -> list[Path]:
        for index_name in (SAFE_INDEX, BIN_INDEX):
            index = self.folder / index_name
            if index.is_file():
                weight_map = read_json(index).get("weight_map")
                if not isinstance(weight_map, dict) or not weight_map:
                    raise ConversionError(f"{index} has no weight_map")
                return sorted({shard_path(self.folder, name, index_name) for name in weight_map.values()})
        for single in (SAFE_SINGLE, BIN_SINGLE):
            if (self.folder / single).is_file():
                return [self.folder / single]
        raise ConversionError(
            f"no weights in {self.folder}: expected {SAFE_SINGLE}, {SAFE_INDEX}, {BIN_SINGLE} or {BIN_INDEX}"
        )

    def _keys_in(self, file: Path) -> list[str]:
        if file.suffix == ".safetensors":
            try:
                handle = safe_open(str(file), framework="pt")
            except (SafetensorError, OSError, ValueError) as e:
                raise ConversionError(f"{file.name} is not a readable safetensors file: {e}") from None
            self._handles[file] = handle
            return list(handle.keys())
        try:
            state = _load_weights_only(file)
        except Exception as e:  # the unpickler refuses anything but tensors and plain containers
            raise ConversionError(f"{file.name} is not a loadable weights-only checkpoint: {e}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ConversionError(f"{file.name} does not hold a flat dict of tensors")
        self._bin[file] = state
        return list(state.keys())

    def keys(self) -> list[str]:
        return list(self._file_of)

    def file_of(self, key: str) -> Path:
        return self._file_of[key]

    def shape(self, key: str) -> tuple[int, ...]:
        file = self._file_of[key]
        if file in self._bin:
            return tuple(self._bin[file][key].shape)
        return tuple(self._handles[file].get_slice(key).get_shape())

    def dtype(self, key: str) -> torch.dtype:
        file = self._file_of[key]
        if file in self._bin:
            return self._bin[file][key].dtype
        return _SAFE_DTYPES[self._handles[file].get_slice(key).get_dtype()]

    def get(self, key: str) -> torch.Tensor:
        file = self._file_of[key]
        if file in self._bin:
            return self._bin[file][key]
        try:
            return self._handles[file].get_tensor(key)
        except (SafetensorError, OSError, ValueError) as e:
            raise ConversionError(f"cannot read tensor {key!r} from {file.name}: {e}") from None


def checked_getter(reader: CheckpointReader) -> Callable[[str], torch.Tensor]:
    """reader.get that warns, once per tensor, about NaN or infinite values in what it hands out."""
    seen: set[str] = set()

    def get(key: str) -> torch.Tensor:
        tensor = reader.get(key)
        if key not in seen:
            seen.add(key)
            warn_if_not_finite(key, tensor, str(reader.file_of(key)))
        return tensor

    return get


def warn_if_not_finite(name: str, tensor: torch.Tensor, where: str) -> None:
    """NaN or infinite weights load fine but poison every output: say which tensor, once, and go on."""
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
        return
    nan = int(torch.isnan(tensor).sum())
    inf = int(torch.isinf(tensor).sum())
    warnings.warn(
        f"tensor {name!r} in {where} holds {nan} NaN and {inf} infinite value(s) of {tensor.numel()}; "
        "outputs computed from it will not be finite",
        CheckpointWarning,
        stacklevel=3,
    )


def _load_weights_only(file: Path):
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:
        # Files saved before torch's zip format cannot be memory-mapped; still weights-only.
        return torch.load(file, map_location="cpu", weights_only=True)


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
    materialize: Callable[[list[str]], dict[str, torch.Tensor]],
    max_shard_size: int,
    progress: bool = True,
) -> list[str]:
    """Writes one shard at a time (peak memory: one shard), with an index when there is more than one."""
    shards = plan_shards(sizes, max_shard_size)
    names = (
        [SAFE_SINGLE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    bar = tqdm(total=sum(s for _, s in sizes), unit="B", unit_scale=True, desc="writing", disable=not progress)
    weight_map = {}
    for file, keys in zip(names, shards, strict=True):
        tensors = {k: t.contiguous() for k, t in materialize(keys).items()}
        _unshare(tensors)
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, file))
        bar.update(sum(t.numel() * t.element_size() for t in tensors.values()))
        del tensors
    bar.close()
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(s for _, s in sizes)}, "weight_map": weight_map}
        (folder / SAFE_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names


def _unshare(tensors: dict[str, torch.Tensor]) -> None:
    # safetensors refuses tensors sharing storage (chunks of one fused tensor); give each its own.
    seen: set[int] = set()
    for name, t in tensors.items():
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            tensors[name] = t.clone()
        seen.add(ptr)


def check_destination(dst: str | os.PathLike, force: bool) -> Path:
    dst = Path(dst)
    recover_destination(dst)
    if (dst.exists() or dst.is_symlink()) and not force:
        raise ConversionError(f"{dst} already exists (use --force / force=True to replace it)")
    return dst


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
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _put_in_place(tmp: Path, dst: Path) -> None:
    if not (dst.exists() or dst.is_symlink()):
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
def atomic_folder(dst: Path, force: bool) -> Iterator[Path]:
    """Yields a temporary folder beside `dst`; on success it replaces `dst`, on failure it vanishes.

    At every instant `dst` is either absent (if it was), the old folder, or the complete new one: the swap over
    an old `dst` is one atomic exchange on Linux. A run killed outright (SIGKILL, power loss) cannot clean up
    after itself; the next conversion to the same `dst` removes what it left behind.
    """
    dst = check_destination(dst, force)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_tmp_prefix(dst)}{os.getpid()}-", dir=dst.parent))
    try:
        # mkdtemp makes the folder private (0700); the result should have the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        try:
            yield tmp
            _put_in_place(tmp, dst)
        except OSError as e:  # disk full, quota, permissions: the user's to fix, not a crash
            kept = "the old one is unchanged" if dst.exists() else "nothing was written there"
            reason = e.strerror or str(e)
            where = f" ({e.filename})" if e.filename else ""
            raise ConversionError(f"cannot write {dst}: {reason}{where}; {kept}") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# Files that travel with the weights: tokenizers, processors, vocabularies.
SIDE_FILE_PATTERNS = (
    "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model",
    "preprocessor_config.json", "image_processor*.json", "processor_config.json", "chat_template*",
)  # fmt: skip


# Code never travels: the only code in a fivefold checkpoint is fivefold's own (see remote_code.py).
_NOT_SIDE_FILES = (".py", ".pyc", ".so", ".pyd", ".dll", ".dylib", ".sh", ".exe")


def copy_side_files(src: Path, dst: Path, patterns: Iterable[str] = SIDE_FILE_PATTERNS) -> list[str]:
    """Copies tokenizer and processor files, never code. A JSON side file's `auto_map` (which would make
    `trust_remote_code=True` run code from elsewhere) is dropped with a warning; a file that is a symlink leading
    out of the checkpoint folder is refused."""
    copied = []
    roots = allowed_roots(src)
    for pattern in patterns:
        for path in sorted(src.glob(pattern)):
            if not path.is_file() or path.suffix.lower() in _NOT_SIDE_FILES or (dst / path.name).exists():
                continue
            if not inside(path, roots):
                raise ConversionError(f"{path.name} in {src} is a link to {path.resolve()}, outside the folder")
            shutil.copy2(path, dst / path.name, follow_symlinks=True)
            _drop_auto_map(dst / path.name)
            copied.append(path.name)
    return copied


def _drop_auto_map(path: Path) -> None:
    if path.suffix != ".json":
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # not ours to judge: the tokenizer will say
    if isinstance(data, dict) and "auto_map" in data:
        warnings.warn(
            f"dropped auto_map {data.pop('auto_map')!r} from {path.name}: fivefold checkpoints ship only "
            "fivefold's own code",
            CheckpointWarning,
            stacklevel=3,
        )
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
