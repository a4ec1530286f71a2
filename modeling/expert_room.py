"""`device_map="auto"` on the CPU for a model with experts: every module but the experts stays in memory, and the
experts share what `max_memory` leaves, each layer's i-th before any layer's (i+1)-th so that the layers keep as
many each; the rest stay on "disk", where the expert cache reads them from the checkpoint when they run.

transformers' own "auto" fills memory in the modules' order and sends whatever comes after to "disk" whole: for the
reduced Mixtral of benchmarks/offload.py with a quarter of its experts' bytes to spare, the last two layers, their
attention included, and the LM head (131 MB, read back at every token). Under an accelerator "auto" stays
transformers' (its devices, its spill to the CPU), and so it does where the modules other than experts do not fit.
"""

import copy
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .expert_store import folder_files, read_header
from .moe import MixtureOfExperts

AUTO = ("auto", "balanced", "balanced_low_0", "sequential")


def unquantized_auto_map(cls: type, name: str | os.PathLike | None, kwargs: dict) -> dict:
    """The load's arguments, with `device_map` computed here for an unquantized model with experts, loaded on the
    CPU with one of transformers' strategies; as given for any other load."""
    if name is None or kwargs.get("device_map") not in AUTO or kwargs.get("quantization_config"):
        return kwargs
    if kwargs.get("state_dict") is not None:
        return kwargs
    room = memory_room(kwargs.get("max_memory"))
    if any(device != "cpu" for device in room):
        return kwargs
    config = load_config(cls, name, kwargs)
    if getattr(config, "quantization_config", None) is not None:
        return kwargs
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    dtype = getattr(config, "dtype", None) if dtype in (None, "auto") else dtype  # what "auto" loads in
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    model = skeleton(cls, config, dtype)
    placed = experts_share_the_rest(model, room.get("cpu", 0), module_sizes(model))
    return kwargs if placed is None else {**kwargs, "device_map": placed}


def memory_room(max_memory: dict | None) -> dict:
    """The bytes each device may hold, as transformers reads `max_memory` (all it finds where none is given),
    "disk" left out."""
    from transformers.integrations.accelerate import get_max_memory

    return {device: size for device, size in get_max_memory(max_memory).items() if device != "disk"}


def load_config(cls: type, name: str | os.PathLike, kwargs: dict) -> Any:
    """The config the load will build the model from: the one given (a copy: building a skeleton sets fields on
    it), or the checkpoint's, with the load's keyword arguments that name its fields applied, as transformers
    applies them."""
    config = kwargs.get("config")
    if hasattr(config, "to_dict"):
        return copy.deepcopy(config)
    hub = {k: kwargs[k] for k in ("revision", "subfolder", "token", "cache_dir", "local_files_only") if k in kwargs}
    config = cls.config_class.from_pretrained(name, **hub)
    for key, value in kwargs.items():
        if key not in ("dtype", "torch_dtype") and not key.startswith("_") and hasattr(config, key):
            setattr(config, key, value)
    return config


def experts_share_the_rest(model: nn.Module, cpu_room: int, sizes: dict[str, int]) -> dict | None:
    """The CPU device map: every module but the experts, then the experts while `cpu_room` lasts, the rest on
    "disk". `sizes`: bytes in all ("") and per expert. None for a model without experts, or where the modules
    other than experts alone take more than `cpu_room`."""
    layers = [(name, len(m.experts)) for name, m in model.named_modules() if isinstance(m, MixtureOfExperts)]
    if not layers:
        return None
    experts = [f"{name}.experts.{i}" for i in range(max(n for _, n in layers)) for name, n in layers if i < n]
    if not all(expert in sizes for expert in experts):
        return None
    room = cpu_room - (sizes[""] - sum(sizes[e] for e in experts))
    if room < 0:
        return None
    placed = {}
    for expert in experts:
        placed[expert] = "cpu" if room >= sizes[expert] else "disk"
        room -= sizes[expert] if placed[expert] == "cpu" else 0
    return covering(model, placed, "cpu")


def module_sizes(model: nn.Module) -> dict[str, int]:
    """Bytes of the model's parameters and buffers in all (""), and of each expert's, in their dtypes."""
    sizes = {"": sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])}
    for name, layer in model.named_modules():
        if isinstance(layer, MixtureOfExperts):
            for i, expert in enumerate(layer.experts):
                sizes[f"{name}.experts.{i}"] = sum(p.numel() * p.element_size() for p in expert.parameters())
    return sizes


def stored_sizes(name: str | os.PathLike, subfolder: str) -> dict[str, int] | None:
    """The bytes a local checkpoint stores, in all ("") and for each expert; None for a name on the Hub."""
    folder = Path(name) / subfolder
    if not folder.is_dir():
        return None
    sizes: dict[str, int] = {"": 0}
    for file in folder_files({folder}):
        for key, entry in read_header(file).items():
            sizes[""] += entry.nbytes
            if (expert := expert_of(key)) is not None:
                sizes[expert] = sizes.get(expert, 0) + entry.nbytes
    return sizes


def expert_of(name: str) -> str | None:
    """The expert a parameter or stored tensor belongs to (`model.layers.3.mlp.experts.5`), if any."""
    head, found, tail = name.rpartition(".experts.")
    index = tail.partition(".")[0]
    return f"{head}.experts.{index}" if found and index.isdigit() else None


def skeleton(cls: type, config: Any, dtype: Any) -> nn.Module:
    with torch.device("meta"):
        if isinstance(dtype, torch.dtype):
            previous = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                return cls(config)
            finally:
                torch.set_default_dtype(previous)
        return cls(config)


def covering(model: nn.Module, placed: dict, default: str | int) -> dict:
    """A device map of disjoint subtrees (as accelerate wants them): `placed` for the modules it names, `default`
    for every other, each subtree as high up as it can be."""
    out, below = {}, {}
    for key, device in placed.items():
        for parent in parents(key) | {""}:
            below.setdefault(parent, set()).add(device)

    def place(module: nn.Module, name: str) -> None:
        if name in placed or below.get(name, set()) <= {default}:
            out[name] = placed.get(name, default)
            return
        for child, sub in module.named_children():
            place(sub, f"{name}.{child}" if name else child)
        for leaf, _ in module.named_parameters(recurse=False):
            out[f"{name}.{leaf}" if name else leaf] = default

    place(model, "")
    return out


def parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}
