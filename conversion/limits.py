"""Bounds on the work a checkpoint can ask for, checked on the numbers it declares before anything is built:
the JSON files it holds (a regular file of bounded size, depth and integer length) and the tensor count its
config implies (each layer, and each expert of a layer, has tensors of its own, so a config cannot ask for more
of them than the checkpoint holds tensors)."""

import json
import os
import stat
from pathlib import Path

from .errors import ConversionError

MAX_JSON_BYTES = 64 * 2**20  # a config, index or tokenizer config; tokenizer.json is copied, never parsed
MAX_JSON_DEPTH = 32  # real configs nest 3 or 4 levels
MAX_DIGITS = 100  # digits in one JSON integer: anything longer is no size, id or count

# Config fields counting layers (summed: T5 has two stacks) and experts per layer.
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")
EXPERT_FIELDS = ("num_local_experts",)


def _kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device",
             stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}  # fmt: skip
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def read_regular_file(path: Path, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. Opened without blocking and checked on the open
    handle, so a FIFO, a device (a link to /dev/zero) or a folder is refused rather than read forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConversionError(f"{path} not found") from None
    except OSError as e:
        raise ConversionError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConversionError(f"{path} is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise ConversionError(f"{path} holds {info.st_size} bytes; fivefold reads at most {limit} from such a file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    except OSError as e:
        raise ConversionError(f"cannot read {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        raise ValueError(f"it holds an integer of {digits} digits (at most {MAX_DIGITS} are read)")
    return int(text)


def _depth(value: object) -> int:
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(raw: bytes, path: Path, max_depth: int | None = MAX_JSON_DEPTH) -> object:
    """JSON with bounded integers and nesting (None: only as deep as the parser goes, for files fivefold does
    not walk, such as a large tokenizer.json); every failure a ConversionError naming the file."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_int=_bounded_int)
    except RecursionError:
        raise ConversionError(f"{path} is not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, _bounded_int
        raise ConversionError(f"{path} is not valid JSON: {e}") from None
    if max_depth is not None and _depth(data) > max_depth:
        raise ConversionError(f"{path} is nested {_depth(data)} levels deep; fivefold reads at most {max_depth}")
    return data


def check_tensor_count(config, tensors: int) -> None:
    """A config asks for at least one tensor per layer and expert: refuse one asking for more than the
    checkpoint holds before a model of that size is built, even on the meta device."""
    layers = sum(getattr(config, name, None) or 0 for name in dict.fromkeys(LAYER_FIELDS) if _counts(config, name))
    experts = max([getattr(config, name, None) or 1 for name in EXPERT_FIELDS] + [1])
    if layers * experts > tensors:
        named = ", ".join(f"{n}={getattr(config, n)}" for n in (*LAYER_FIELDS, *EXPERT_FIELDS) if _counts(config, n))
        raise ConversionError(
            f"the config asks for {layers * experts} layers and experts ({named}) but the checkpoint holds "
            f"{tensors} tensors, fewer than one each"
        )


def _counts(config, name: str) -> bool:
    # T5's `num_hidden_layers` is an alias of `num_layers`: count each stored field once.
    value = getattr(config, name, None)
    aliases = getattr(config, "attribute_map", {})
    return isinstance(value, int) and not isinstance(value, bool) and name not in aliases
