"""convert / export: stock checkpoint <-> fivefold checkpoint, every tensor accounted for, written atomically."""

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch

from .architecture import stock_class_name
from .errors import ConversionError
from .hub import HubRef, check_can_push, push_folder
from .integrity import folder_hashes
from .keymap import Plan
from .model_card import model_card
from .reader import CheckpointReader, checked_getter
from .remote_code import remote_code_bytes, write_remote_code
from .sentence_modules import copy_sentence_transformers_files, is_sentence_transformers
from .side_files import copy_side_files, write_legacy_generation_config
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

    def materialize(keys: list[str], done: Callable[[int], object] = lambda nbytes: None) -> dict[str, torch.Tensor]:
        """Reads, checks and maps the tensors of `keys`, calling `done(bytes)` after each one (the progress bar)."""
        out: dict[str, torch.Tensor] = {}
        for key in keys:
            if key not in out:
                made = {k: v for k, v in plan.run(step_of[key], get).items() if k in keys}
                if dtype is not None:
                    made = {k: v.to(dtype) if v.is_floating_point() else v for k, v in made.items()}
                out.update(made)
                done(sum(t.numel() * t.element_size() for t in made.values()))
        return out

    return materialize


def _sizes(produced: dict, plan: Plan, reader, dtype) -> list[tuple[str, int]]:
    src_dtype = plan.target_dtypes(reader.dtype)
    sizes = []
    for key, shape in produced.items():
        dt = dtype if dtype is not None and src_dtype[key].is_floating_point else src_dtype[key]
        sizes.append((key, int(torch.Size(shape).numel()) * torch.empty((), dtype=dt).element_size()))
    return sizes


def _write_weights_and_side_files(tmp: Path, src: Path, plan, reader, sizes, dtype, max_shard_size, progress, aligned):
    materialize = _materializer(plan, reader, dtype)
    write_safetensors(tmp, sizes, materialize, parse_size(max_shard_size), progress, aligned=aligned)
    copy_side_files(src, tmp)
    copy_sentence_transformers_files(src, tmp)


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    dtype: str | None = None,
    max_shard_size: int | str = "5GB",
    force: bool = False,
    progress: bool = True,
    revision: str | None = None,
    subfolder: str | None = None,
    token: str | bool | None = None,
    push_to_hub: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
) -> Path:
    """Converts a public checkpoint (folder or Hub id, read at `revision` inside `subfolder` with `token`) into
    fivefold's layout at `dst`; returns `dst`. With `push_to_hub="org/name"`, then uploads `dst` whole to that
    repo in one commit (`private`, `commit_message`, the same `token`).

    Raises ConversionError, leaving `dst` untouched, if any tensor is unknown, missing or of the wrong shape, and
    if the upload fails (nothing is pushed then; `dst` stays written).
    """
    if dtype is not None and dtype not in DTYPES:
        raise ConversionError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    if push_to_hub is not None:
        check_can_push(token)
    dst = check_destination(dst, force)
    folder = resolve_source(src, HubRef(revision, subfolder, token))
    hub_id = None if Path(src).is_dir() else str(src)
    check_apart(folder, dst)
    stock = read_config(folder)
    arch = architecture_of(stock, folder, want_stock=True)
    target = model_class_of(arch, stock, folder)
    config = build_config(arch, stock, target, folder)
    reader = CheckpointReader(folder)
    shapes = {k: reader.shape(k) for k in reader.keys()}
    plan = arch.keys(config).plan(reader.keys(), arch.stock_prefix_of(target), our_prefix(arch, target))
    _, tied = check_plan(arch, target, config, plan, shapes, strict=True, reader=reader)
    check_aliases(plan, reader)
    drop_tied_copies(plan, reader, config, tied)
    produced = plan.target_shapes(shapes)
    if dtype is not None:
        config.dtype = DTYPES[dtype]

    sizes = _sizes(produced, plan, reader, DTYPES.get(dtype))
    needed = sum(size for _, size in sizes) + remote_code_bytes(arch.config_class)
    with atomic_folder(dst, force, needed=needed) as tmp:
        _write_weights_and_side_files(
            tmp, folder, plan, reader, sizes, DTYPES.get(dtype), max_shard_size, progress, aligned=True
        )
        config.auto_map = write_remote_code(tmp, arch.config_class)
        config.save_pretrained(tmp)
        write_legacy_generation_config(folder, stock, target, tmp)
        where = dict(hub_id=hub_id, repo_id=push_to_hub, sentence_transformers=is_sentence_transformers(folder))
        card = model_card(arch, target, str(src), folder, **where, hashes=folder_hashes(tmp))
        (tmp / "README.md").write_text(card, encoding="utf-8")
    if push_to_hub is not None:
        push_folder(dst, push_to_hub, private=private, commit_message=commit_message, token=token)
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
    revision: str | None = None,
    subfolder: str | None = None,
    token: str | bool | None = None,
) -> Path:
    """Writes a fivefold checkpoint (folder or Hub id) back in the stock layout (the inverse key map: a lossless
    round trip)."""
    dst = check_destination(dst, force)
    folder = resolve_source(src, HubRef(revision, subfolder, token))
    check_apart(folder, dst)
    ours = read_config(folder)
    arch = architecture_of(ours, folder, want_stock=False)
    target = model_class_of(arch, ours, folder)
    config = config_from_dict(arch, ours, folder)
    reader = CheckpointReader(folder, rename=current_name(target))
    shapes = {k: reader.shape(k) for k in reader.keys()}
    dtypes = {k: reader.dtype(k) for k in reader.keys()}
    check_tensors(arch, target, config, shapes, None, strict=True, dtypes=dtypes)
    stock_prefix = "" if target is arch.base_model else arch.stock_prefix_of(target)
    plan = arch.keys(config).plan(reader.keys(), stock_prefix, our_prefix(arch, target), inverse=True)
    produced = plan.target_shapes(shapes)

    sizes = _sizes(produced, plan, reader, None)
    with atomic_folder(dst, force, needed=sum(size for _, size in sizes)) as tmp:
        # Laid out as safetensors lays out the stock folder it came from: transformers computes on mapped weights.
        _write_weights_and_side_files(tmp, folder, plan, reader, sizes, None, max_shard_size, progress, aligned=False)
        stock = stock_config_dict(arch, ours, stock_class_name(target))
        (tmp / "config.json").write_text(json.dumps(stock, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return dst
