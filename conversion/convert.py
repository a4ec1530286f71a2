"""convert / export: stock checkpoint <-> fivefold checkpoint, every tensor accounted for, written atomically."""

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch

from .architecture import stock_class_name
from .errors import ConversionError
from .keymap import Plan
from .reader import CheckpointReader, checked_getter
from .remote_code import write_remote_code
from .side_files import copy_side_files
from .source import (
    architecture_of,
    build_config,
    config_from_dict,
    model_class_of,
    read_config,
    resolve_source,
    stock_config_dict,
)
from .validation import check_aliases, check_plan, check_tensors, drop_tied_copies, our_prefix
from .writer import atomic_folder, check_apart, check_destination, parse_size, write_safetensors

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _materializer(plan: Plan, reader: CheckpointReader, dtype: torch.dtype | None):
    step_of = {t: step for step in plan.steps for t in step.targets}
    get = checked_getter(reader)

    def materialize(keys: list[str]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for key in keys:
            if key not in out:
                out.update({k: v for k, v in plan.run(step_of[key], get).items() if k in keys})
        if dtype is not None:
            out = {k: v.to(dtype) if v.is_floating_point() else v for k, v in out.items()}
        return out

    return materialize


def _sizes(produced: dict, plan: Plan, reader, dtype) -> list[tuple[str, int]]:
    src_dtype = {t: reader.dtype(step.sources[0]) for step in plan.steps for t in step.targets}
    sizes = []
    for key, shape in produced.items():
        dt = dtype if dtype is not None and src_dtype[key].is_floating_point else src_dtype[key]
        sizes.append((key, int(torch.Size(shape).numel()) * torch.empty((), dtype=dt).element_size()))
    return sizes


def _write_weights_and_side_files(tmp: Path, src: Path, plan, reader, produced, dtype, max_shard_size, progress):
    sizes = _sizes(produced, plan, reader, dtype)
    write_safetensors(tmp, sizes, _materializer(plan, reader, dtype), parse_size(max_shard_size), progress)
    copy_side_files(src, tmp)


def model_card(base_model: str, target: str, model_type: str) -> str:
    return f"""---
base_model: {base_model}
library_name: transformers
tags:
- fivefold
---

# {Path(base_model).name} for fivefold

`{base_model}` converted with `fivefold convert` to the `{model_type}` layout ({target}).
Tensors were renamed, not changed; `fivefold export` writes the stock layout back.

```python
import fivefold  # registers fivefold's model types
from transformers import AutoModel

model = AutoModel.from_pretrained("path/to/this/folder")
```

Without fivefold installed, pass `trust_remote_code=True` to the model's and the tokenizer's `from_pretrained`:
the modeling code ships in this folder.
"""


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    dtype: str | None = None,
    max_shard_size: int | str = "5GB",
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Converts a public checkpoint (folder or Hub id) into fivefold's layout at `dst`; returns `dst`.

    Raises ConversionError, leaving `dst` untouched, if any tensor is unknown, missing or of the wrong shape.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ConversionError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    dst = check_destination(dst, force)
    folder = resolve_source(src)
    check_apart(folder, dst)
    stock = read_config(folder)
    arch = architecture_of(stock, folder, want_stock=True)
    target = model_class_of(arch, stock, folder)
    config = build_config(arch, stock, target, folder)
    reader = CheckpointReader(folder)
    shapes = {k: reader.shape(k) for k in reader.keys()}
    plan = arch.keys(config).plan(reader.keys(), arch.stock_prefix, our_prefix(arch, target))
    _, tied = check_plan(arch, target, config, plan, shapes, strict=True, reader=reader)
    check_aliases(plan, reader)
    drop_tied_copies(plan, reader, config, tied)
    produced = plan.target_shapes(shapes)
    if dtype is not None:
        config.dtype = DTYPES[dtype]

    with atomic_folder(dst, force) as tmp:
        _write_weights_and_side_files(tmp, folder, plan, reader, produced, DTYPES.get(dtype), max_shard_size, progress)
        config.auto_map = write_remote_code(tmp, arch.config_class)
        config.save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(str(src), target.__name__, arch.model_type), encoding="utf-8")
    return dst


def current_name(target: type) -> Callable[[str], str] | None:
    """Today's name of a tensor in a fivefold folder written by an earlier layout (the model's `_renamed_keys`)."""
    renames = [(re.compile(old), new) for old, new in target._renamed_keys.items()]
    if not renames:
        return None

    def rename(key: str) -> str:
        for old, new in renames:
            key = old.sub(new, key)
        return key

    return rename


def export(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Writes a fivefold checkpoint back in the stock layout (the inverse key map: a lossless round trip)."""
    dst = check_destination(dst, force)
    folder = resolve_source(src)
    check_apart(folder, dst)
    ours = read_config(folder)
    arch = architecture_of(ours, folder, want_stock=False)
    target = model_class_of(arch, ours, folder)
    config = config_from_dict(arch, ours, folder)
    reader = CheckpointReader(folder, rename=current_name(target))
    shapes = {k: reader.shape(k) for k in reader.keys()}
    dtypes = {k: reader.dtype(k) for k in reader.keys()}
    check_tensors(arch, target, config, shapes, None, strict=True, dtypes=dtypes)
    stock_prefix = "" if target is arch.base_model else arch.stock_prefix
    plan = arch.keys(config).plan(reader.keys(), stock_prefix, our_prefix(arch, target), inverse=True)
    produced = plan.target_shapes(shapes)

    with atomic_folder(dst, force) as tmp:
        _write_weights_and_side_files(tmp, folder, plan, reader, produced, None, max_shard_size, progress)
        stock = stock_config_dict(arch, ours, stock_class_name(target))
        (tmp / "config.json").write_text(json.dumps(stock, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return dst
