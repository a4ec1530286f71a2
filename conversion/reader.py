"""Reading checkpoints safely: safetensors first; `.bin` only through `torch.load(weights_only=True)`; shard
indexes may only name files inside the checkpoint folder."""

import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .errors import CheckpointWarning, ConversionError
from .limits import parse_json, read_regular_file

SAFE_SINGLE, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN_SINGLE, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"

_SAFE_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
_MAX_NAME_BYTES, _MAX_PATH_BYTES = 255, 4096  # Linux's NAME_MAX and PATH_MAX


def read_json(path: Path) -> dict:
    data = parse_json(read_regular_file(path), path)
    if not isinstance(data, dict):
        raise ConversionError(f"{path} must hold a JSON object")
    return data


def allowed_roots(folder: Path) -> list[Path]:
    """Where the files of a checkpoint folder may really live: the folder itself and, for a Hub cache snapshot
    (`.../snapshots/<revision>`, or a subfolder of one, whose files are symlinks into the repo's `blobs/`), that
    blob store."""
    root = folder.resolve()
    roots = [root]
    snapshot = next((p for p in (folder, *folder.parents) if p.parent.name == "snapshots"), None)
    if snapshot is not None:
        roots.append((snapshot.parent.parent / "blobs").resolve())
    return roots


def inside(path: Path, roots: list[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved == root or root in resolved.parents for root in roots)


def shard_path(folder: Path, name: object, index_file: str) -> Path:
    """The shard file an index names, refusing anything that would leave the folder."""
    if not _plausible_file_name(name):
        shown = repr(name) if len(repr(name)) < 80 else f"{repr(name)[:60]}... ({len(name)} characters)"
        raise ConversionError(f"{index_file} names an invalid shard file {shown}")
    if Path(name).is_absolute():
        raise ConversionError(f"{index_file} names {name!r}, an absolute path outside the checkpoint folder {folder}")
    path = folder / name
    if not inside(path, allowed_roots(folder)):
        raise ConversionError(f"{index_file} names {name!r}, which lies outside the checkpoint folder {folder}")
    if not path.is_file():
        raise ConversionError(f"{index_file} names {name!r}, which does not exist in {folder}")
    return path


def _plausible_file_name(name: object) -> bool:
    """A relative or absolute path the file system could hold: no NUL byte, no backslash, within its limits."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return False
    try:
        encoded = os.fsencode(name)
    except UnicodeError:
        return False
    return len(encoded) <= _MAX_PATH_BYTES and all(len(part) <= _MAX_NAME_BYTES for part in encoded.split(b"/"))


def with_variant(name: str, variant: str | None) -> str:
    """transformers' name of a weights file of a variant: `model.safetensors` -> `model.fp16.safetensors`."""
    if variant is None:
        return name
    stem, extension = name.rsplit(".", 1)
    return f"{stem}.{variant}.{extension}"


def renamed_by(key_mapping: dict[str, str] | None) -> Callable[[str], str] | None:
    """`from_pretrained(key_mapping=...)` as transformers applies it to stored names: each pattern's first match
    substituted, in turn (`{"^backbone\\.": ""}` strips a prefix)."""
    if not key_mapping:
        return None
    patterns = [(re.compile(pattern), replacement) for pattern, replacement in key_mapping.items()]

    def rename(key: str) -> str:
        for pattern, replacement in patterns:
            key = pattern.sub(replacement, key, count=1)
        return key

    return rename


class CheckpointReader:
    """Lazy access to the tensors of one checkpoint folder, by name. Given `rename`, every stored tensor is
    presented under `rename(stored_name)` (a folder written by an earlier tensor layout, read as today's).
    `variant` and `use_safetensors` pick the weights files as transformers' `from_pretrained` does."""

    def __init__(
        self,
        folder: str | os.PathLike,
        rename: Callable[[str], str] | None = None,
        variant: str | None = None,
        use_safetensors: bool | None = None,
    ):
        self.folder = Path(folder)
        self.variant, self.use_safetensors = variant, use_safetensors
        self._file_of: dict[str, Path] = {}
        self._stored_name: dict[str, str] = {}
        self._handles: dict[Path, object] = {}
        self._bin: dict[Path, dict[str, torch.Tensor]] = {}
        for file in self._weight_files():
            for stored in self._keys_in(file):
                key = rename(stored) if rename is not None else stored
                if key in self._file_of:
                    raise ConversionError(self._clash(key, stored, file))
                self._file_of[key] = file
                self._stored_name[key] = stored

    def _clash(self, key: str, stored: str, file: Path) -> str:
        first, first_file = self._stored_name[key], self._file_of[key].name
        if first == stored:
            return f"tensor {key!r} appears in both {first_file} and {file.name}"
        return f"tensors {first!r} ({first_file}) and {stored!r} ({file.name}) are both renamed to {key!r}"

    def _weight_files(self) -> list[Path]:
        safetensors, pickled = (SAFE_INDEX, SAFE_SINGLE), (BIN_INDEX, BIN_SINGLE)
        formats = {None: (safetensors, pickled), True: (safetensors,), False: (pickled,)}[self.use_safetensors]
        names = [(with_variant(index, self.variant), with_variant(single, self.variant)) for index, single in formats]
        for index_name, _ in names:
            index = self.folder / index_name
            if index.is_file():
                weight_map = read_json(index).get("weight_map")
                if not isinstance(weight_map, dict) or not weight_map:
                    raise ConversionError(f"{index} has no weight_map")
                return sorted({shard_path(self.folder, name, index_name) for name in weight_map.values()})
        for _, single in names:
            if (self.folder / single).is_file():
                return [self.folder / single]
        expected = [name for pair in names for name in reversed(pair)]
        raise ConversionError(f"no weights in {self.folder}: expected {', '.join(expected[:-1])} or {expected[-1]}")

    @staticmethod
    def _open(file: Path):
        try:
            return safe_open(str(file), framework="pt")
        except (SafetensorError, OSError, ValueError) as e:
            raise ConversionError(f"{file.name} is not a readable safetensors file: {e}") from None

    def _keys_in(self, file: Path) -> list[str]:
        if file.suffix == ".safetensors":
            handle = self._handles[file] = self._open(file)  # kept for names, shapes and dtypes: the header only
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
        file, stored = self._file_of[key], self._stored_name[key]
        if file in self._bin:
            return tuple(self._bin[file][stored].shape)
        return tuple(self._handles[file].get_slice(stored).get_shape())

    def dtype(self, key: str) -> torch.dtype:
        file, stored = self._file_of[key], self._stored_name[key]
        if file in self._bin:
            return self._bin[file][stored].dtype
        stored_dtype = self._handles[file].get_slice(stored).get_dtype()
        if stored_dtype not in _SAFE_DTYPES:
            raise ConversionError(f"tensor {key!r} in {file.name} is stored as {stored_dtype}, which torch cannot hold")
        return _SAFE_DTYPES[stored_dtype]

    def get(self, key: str) -> torch.Tensor:
        file, stored = self._file_of[key], self._stored_name[key]
        if file in self._bin:
            return self._bin[file][stored]
        try:
            # A handle of its own, closed on return: the memory map, and every page this read made resident, go
            # with it, so that reading a checkpoint tensor by tensor holds only the tensors handed out.
            return self._open(file).get_tensor(stored)
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


def all_finite(tensor: torch.Tensor, chunk: int = 1 << 24) -> bool:
    """Whether every value is finite, checked a chunk at a time: `isfinite` on a whole bf16 tensor makes an fp32
    copy and a mask of it, 2.5 times the tensor, which would set the peak memory of a streamed conversion."""
    flat = tensor.reshape(-1)
    return all(bool(torch.isfinite(flat[i : i + chunk]).all()) for i in range(0, flat.numel(), chunk))


def warn_if_not_finite(name: str, tensor: torch.Tensor, where: str) -> None:
    """NaN or infinite weights load fine but poison every output: say which tensor, once, and go on."""
    if not tensor.is_floating_point() or all_finite(tensor):
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
