"""Experts bigger than memory: after `from_pretrained` with a `device_map` that offloads experts ("disk", or "cpu"
under an accelerator), each offloaded expert's accelerate hooks are replaced by one that goes through the model's
expert cache (expert_cache.py), optionally fed by reads ahead (prefetch.py). Nothing is written at load: an expert
on "disk" is read from the tensor transformers' offload index names, the checkpoint's own safetensors file for a
converted folder (an offload folder only where transformers had to write one, as for a stock folder converted in
memory).

The budget: `config.expert_cache_bytes` (an int, or a size such as "4GB"; 0 turns the cache off, so that each
offloaded expert is read for every call, as accelerate does). By default it is what `max_memory` leaves on the
execution device after everything resident there but the experts the cache manages, and at least the bytes of the
experts the device map placed there (which start cached and may be evicted and read back from the checkpoint).
`config.expert_prefetch` turns the reads ahead on. With the cache on, experts are read past the page cache
(expert_store.py; `config.expert_direct_reads` says otherwise). Every MoE layer (`MixtureOfExperts`) of any
architecture is reached; nothing here knows which architecture it serves.
"""

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from accelerate.hooks import ModelHook, SequentialHook, add_hook_to_module, remove_hook_from_module
from accelerate.utils import convert_file_size_to_int, send_to_device
from torch import nn

from .expert_cache import ExpertCache
from .expert_eviction import eviction_named
from .expert_shares import count_at_largest
from .expert_store import FileTensor, MemoryTensor, folder_files, index_files
from .moe import MixtureOfExperts
from .offloaded_expert import OffloadedExpert
from .prefetch import ExpertPrefetcher
from .quantized_experts import expert_sources, held_bytes


class OffloadedTraining(RuntimeError):
    """Training a model whose experts are offloaded."""


class ExpertHook(ModelHook):
    """Runs one offloaded expert through the cache: its weights put on the device before the call, and dropped after
    it unless cached. `weights_map` lets `save_pretrained` read the expert back, as it reads accelerate's."""

    def __init__(self, cache: ExpertCache, expert: OffloadedExpert):
        self.cache, self.expert = cache, expert
        self.weights_map = ExpertWeights(expert)

    def pre_forward(self, module: nn.Module, *args, **kwargs):
        if module.training and torch.is_grad_enabled():
            raise OffloadedTraining(
                f"{self.expert} is offloaded (device_map placed it on 'disk' or 'cpu'): its weights are read back "
                "for each call and dropped, so training cannot update them. Train with every expert on the "
                "execution device (no offloading device_map), or call model.eval() / torch.no_grad() to run it."
            )
        device = self.cache.acquire(self.expert, args[0].shape[0] if args else 1)
        return send_to_device(args, device), send_to_device(kwargs, device)

    def post_forward(self, module: nn.Module, output):
        self.cache.done(self.expert)
        return output


class ExpertWeights(Mapping):
    """An offloaded expert's tensors by parameter name, read on access (in CPU memory)."""

    def __init__(self, expert: OffloadedExpert):
        self.expert = expert

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.expert.shapes:  # a stored part of a quantized weight, saved as stored
            return self.expert.sources[name].read()
        parts = self.expert.assemble.stored_names(name)
        return self.expert.typed({part: self.expert.sources[part].read() for part in parts})[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.expert.shapes)

    def __len__(self) -> int:
        return len(self.expert.shapes)


def attach_expert_offload(model: nn.Module, max_memory: dict | None = None) -> ExpertCache | None:
    """Puts the model's offloaded experts under one expert cache (`model.expert_cache`); None if none is
    offloaded."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, MixtureOfExperts)]
    offloaded = [found for name, layer in layers for found in _offloaded(name, layer)]
    files, left = getattr(model, "experts_left_in_checkpoint", ([], {}))
    stored = index_files(files) if left else ({}, {})
    offloaded += _left_in_checkpoint(layers, left, stored)
    if not offloaded:
        return None
    setting = getattr(model.config, "expert_cache_bytes", None)
    budget = None if setting is None else convert_file_size_to_int(setting)
    if budget != 0:  # experts the device map placed on the device are the cache's too, where it can read them back
        if not left:  # the folders accelerate's offload index reads the offloaded experts from
            folders = {Path(s.path).parent for e in offloaded for s in e.sources.values() if _on_disk(s)}
            stored = index_files(folder_files(folders))
        offloaded += _resident(layers, stored)
    count_at_largest(offloaded)
    if budget is None:
        budget = _default_budget(model, offloaded, max_memory)
    direct = getattr(model.config, "expert_direct_reads", None)
    for expert in offloaded:
        for source in expert.sources.values():
            if _on_disk(source):
                source.direct = budget > 0 if direct is None else bool(direct)
    eviction = eviction_named(getattr(model.config, "expert_cache_eviction", "lru"))
    cache = ExpertCache(offloaded, budget, eviction=eviction)
    for expert in offloaded:
        remove_hook_from_module(expert.module, recurse=True)
        add_hook_to_module(expert.module, ExpertHook(cache, expert))
    if getattr(model.config, "expert_prefetch", False):
        cache.prefetcher = ExpertPrefetcher(cache, layers)
    return cache


def check_stock_offload(name: str | os.PathLike, load_kwargs: dict) -> None:
    """A stock folder is converted in memory, so experts it places on "disk" have no file of fivefold's layout to be
    read from: transformers must write them to an offload folder."""
    device_map = load_kwargs.get("device_map")
    if isinstance(device_map, dict) and "disk" in device_map.values() and load_kwargs.get("offload_folder") is None:
        raise ValueError(
            f"{name} is a stock checkpoint, converted in memory: the modules its device_map places on 'disk' have "
            "no converted file to be read from. Convert it once (`fivefold convert SRC DST`, shard by shard) and "
            "load DST, which serves them from its own files, or pass offload_folder= for transformers to write "
            "them there at load."
        )


def _on_disk(source) -> bool:
    return isinstance(source, FileTensor)


def _offloaded(layer_name: str, layer: MixtureOfExperts) -> Iterator[OffloadedExpert]:
    """The experts of a layer whose weights accelerate's hooks bring in at each call, with where they read them."""
    for index, expert in enumerate(layer.experts):
        sources, device = {}, None
        for sub_name, sub in expert.named_modules():
            for hook in _hooks(sub):
                if not getattr(hook, "offload", False) or hook.weights_map is None:
                    continue
                device = hook.execution_device
                for leaf, _ in sub.named_parameters(recurse=False):
                    name = f"{sub_name}.{leaf}" if sub_name else leaf
                    sources[name] = _source(hook.weights_map, leaf)
        if sources:
            yield OffloadedExpert(expert, layer_name, index, sources, device)


def _hooks(module: nn.Module) -> list:
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    return list(hook.hooks) if isinstance(hook, SequentialHook) else [hook]


def _source(weights_map, leaf: str):
    """Where accelerate's weights map reads a tensor: an offload index entry (a safetensors tensor) or memory."""
    loader, key = getattr(weights_map, "dataset", weights_map), f"{getattr(weights_map, 'prefix', '')}{leaf}"
    state_dict, index = getattr(loader, "state_dict", {}), getattr(loader, "index", {})
    if key in state_dict:
        return MemoryTensor(state_dict[key])
    info = index.get(key, {})
    if info.get("safetensors_file") is None:
        raise ValueError(f"{key} is offloaded in a format fivefold's expert cache cannot read (not safetensors)")
    return FileTensor(info["safetensors_file"], info.get("weight_name", key))


def _resident(layers: list, stored: tuple[dict, dict]) -> list[OffloadedExpert]:
    """The experts the device map placed on the execution device whose tensors the checkpoint files hold."""
    found = []
    for layer_name, layer in layers:
        for index, expert in enumerate(layer.experts):
            params = dict(expert.named_parameters())
            if not params or any(p.device.type == "meta" for p in params.values()):
                continue
            where = expert_sources(expert, f"{layer_name}.experts.{index}.", *stored)
            if where is not None:
                device = next(iter(params.values())).device
                found.append(OffloadedExpert(expert, layer_name, index, where[0], device, assemble=where[1]))
    return found


def _left_in_checkpoint(layers: list, left: dict[str, str], stored: tuple[dict, dict]) -> list[OffloadedExpert]:
    """The experts a quantized load left unread in the checkpoint (prequantized_offload.py), on meta until they
    run on `left`'s device for them."""
    found = []
    for layer_name, layer in layers:
        for index, expert in enumerate(layer.experts):
            name = f"{layer_name}.experts.{index}"
            if name not in left:
                continue
            where = expert_sources(expert, f"{name}.", *stored)
            if where is None:
                raise ValueError(f"{name} was left in the checkpoint at load, which no longer holds all its tensors")
            found.append(OffloadedExpert(expert, layer_name, index, where[0], left[name], assemble=where[1]))
    return found


def _default_budget(model: nn.Module, experts: list[OffloadedExpert], max_memory: dict | None) -> int:
    """What `max_memory` leaves on the execution device after what stays resident there, and at least the bytes of
    the experts the device map placed there."""
    placed = sum(e.nbytes for e in experts if e.materialized)
    device = experts[0].device
    key = device.index if device.type == "cuda" else device.type
    limit = (max_memory or {}).get(key, (max_memory or {}).get(str(device)))
    if limit is None:
        return placed
    managed = {id(p) for e in experts for p in e.module.parameters()}
    tensors = [*model.parameters(), *model.buffers()]
    resident = sum(held_bytes(t) for t in tensors if t.device == device and id(t) not in managed)
    limit = int(limit) if isinstance(limit, int | float) else convert_file_size_to_int(limit)  # 6e9 as accelerate
    return max(placed, limit - resident)
