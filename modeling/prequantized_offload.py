"""Loading a quantized checkpoint (torchao, or bitsandbytes 4-bit) with experts on "disk": the experts stay in the
checkpoint, unread, and the expert cache reads them in their quantized form when they run (quantized_experts.py),
an int8 expert a quarter of an fp32 one's bytes, a 4-bit one an eighth.

transformers 5.24 refuses any "disk" in the device map of such a checkpoint: its offloading writes full-precision
tensors, and cannot hold torchao's ("not supported yet"); bitsandbytes' quantizer refuses "cpu" and "disk" beside
an accelerator, and would keep those modules unquantized. So transformers never sees those experts on "disk": the device
map it is given puts each on its layer's execution device, the load leaves its tensors unread (they are not handed
to the loader) and its parameters on meta (not materialized as missing, nor reported missing), and
`model.experts_left_in_checkpoint` tells `attach_expert_offload` where they are. Only experts may be left so: any
other module on "disk" is an error naming it. `device_map="auto"` is computed here: on the CPU, every module but
the experts in memory and the experts sharing what `max_memory` leaves, sized by the bytes the checkpoint stores;
under an accelerator, transformers' own map (past its check that refuses "disk"). `model.hf_device_map` says
"disk" for the experts left, as it does for offloaded modules.
"""

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open
from torch import nn
from transformers.integrations.accelerate import expand_device_map

from .expert_room import (
    AUTO,
    expert_of,
    experts_share_the_rest,
    load_config,
    memory_room,
    parents,
    stored_sizes,
    unquantized_auto_map,
)
from .expert_room import skeleton as meta_skeleton
from .moe import MixtureOfExperts
from .quantization import QuantizationError, quant_method

# The experts the load in progress leaves in the checkpoint ({module name: execution device}), from `from_pretrained`
# to the loader (`_load_pretrained_model`), which transformers calls in between.
_LEAVING: ContextVar[dict[str, str] | None] = ContextVar("experts_left_in_checkpoint", default=None)


@dataclass(frozen=True)
class Plan:
    kwargs: dict  # the load's arguments, with the experts left in the checkpoint on their execution device
    left: dict[str, str]  # {expert: execution device}; none for any other load
    device_map: dict | None = None  # as asked for, computed for "auto"; None: transformers' own

    def done(self, loaded: Any) -> Any:
        """The loaded model (or (model, info)), its `hf_device_map` saying "disk" where its experts stay."""
        if self.device_map is not None:
            (loaded[0] if isinstance(loaded, tuple) else loaded).hf_device_map = self.device_map
        return loaded


def plan(cls: type, name: str | os.PathLike | None, kwargs: dict) -> Plan:
    """How to load: for a pre-quantized checkpoint whose experts the cache reads quantized (torchao, bitsandbytes
    4-bit) with "auto" or a device map that puts experts on "disk", which experts to leave in the checkpoint; for
    an unquantized one with "auto" on the CPU, the experts sharing what the rest leaves (expert_room.py); any other
    load as it is asked."""
    return _plan(cls, name, kwargs) or Plan(unquantized_auto_map(cls, name, kwargs), {})


def _plan(cls: type, name: str | os.PathLike | None, kwargs: dict) -> Plan | None:
    device_map = kwargs.get("device_map")
    if name is None or device_map is None or kwargs.get("quantization_config") is not None:
        return None
    if kwargs.get("state_dict") is not None or not (isinstance(device_map, dict) or device_map in AUTO):
        return None
    config = load_config(cls, name, kwargs)
    method = _method_leaving_experts(getattr(config, "quantization_config", None))
    if method is None:
        return None
    skeleton = meta_skeleton(cls, config, kwargs.get("dtype"))
    if not any(isinstance(m, MixtureOfExperts) for m in skeleton.modules()):
        return None  # no experts to leave: transformers' own handling
    if isinstance(device_map, str):  # computed here whatever it holds: transformers' own "auto" sizes otherwise
        stored = stored_sizes(name, kwargs.get("subfolder") or "")
        device_map = _auto_device_map(skeleton, device_map, kwargs.get("max_memory"), stored)
    elif "disk" not in device_map.values():
        return None
    placed, left = _experts_to_leave(skeleton, device_map, method)
    return Plan({**kwargs, "device_map": placed}, left, device_map)


def _method_leaving_experts(quantization_config: Any) -> str | None:
    """The quantizer of a checkpoint whose experts can stay in it, read quantized when they run: torchao's tensors,
    and bitsandbytes' 4-bit ones (its 8-bit weights keep outliers in full precision at run time); None for others."""
    method = quant_method(quantization_config)
    if method == "torchao":
        return method
    if method == "bitsandbytes":
        if isinstance(quantization_config, dict):
            four_bit = quantization_config.get("load_in_4bit") or quantization_config.get("_load_in_4bit")
        else:
            four_bit = getattr(quantization_config, "load_in_4bit", False)
        return "bitsandbytes 4-bit" if four_bit else None
    return None


@contextmanager
def leaving(left: dict[str, str]) -> Iterator[None]:
    token = _LEAVING.set(left)
    try:
        yield
    finally:
        _LEAVING.reset(token)


def left_by_this_load() -> dict[str, str] | None:
    return _LEAVING.get()


def load_leaving(left: dict[str, str], load, model: nn.Module, checkpoint_files: list[str], *args: Any) -> tuple:
    """transformers' loading (`load`) of every tensor but those of the experts `left` in the checkpoint, which stay
    on meta, are not reported missing, and are recorded on the model for the expert cache."""
    record(model, checkpoint_files, left)
    with read_without_experts(checkpoint_files, left) as read:
        info, index = load(model, read, checkpoint_files, *args)
    info.missing_keys = {key for key in info.missing_keys if expert_of(key) not in left}
    return info, index


@contextmanager
def read_without_experts(checkpoint_files: list[str], left: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The state dict of `checkpoint_files` as lazy slices, without any tensor of the experts left in them."""
    with ExitStack() as stack:
        state_dict = {}
        for file in checkpoint_files:
            shard = stack.enter_context(safe_open(file, framework="pt"))
            state_dict.update({key: shard.get_slice(key) for key in shard.keys() if expert_of(key) not in left})
        yield state_dict


def record(model: nn.Module, checkpoint_files: list[str], left: dict[str, str]) -> None:
    model.experts_left_in_checkpoint = ([Path(f) for f in checkpoint_files], dict(left))


def _auto_device_map(skeleton: nn.Module, strategy: str, max_memory: dict | None, stored: dict | None) -> dict:
    """On the CPU: every module but the experts in memory, then the experts while `max_memory` leaves room, each
    layer's i-th before any layer's (i+1)-th so that the layers keep as many each, the rest on "disk". Sizes are the
    checkpoint's stored bytes (`stored`, a local folder's), else the quantizer's with transformers' margin for the
    scales. Under an accelerator, transformers' own map for `strategy` (its devices, its spill to the CPU); only its
    experts may then be on "disk"."""
    from transformers.integrations.accelerate import _get_device_map, compute_module_sizes
    from transformers.quantizers import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(skeleton.config.quantization_config, pre_quantized=True)
    quantizer.preprocess_model(model=skeleton, dtype=skeleton.dtype, device_map=None, checkpoint_files=None)
    room = memory_room(max_memory)
    if any(device != "cpu" for device in room):
        return _get_device_map(skeleton, strategy, max_memory, _WithoutDiskCheck(quantizer))
    experts = [f"{name}.experts.{i}" for name, m in skeleton.named_modules() if isinstance(m, MixtureOfExperts)
               for i in range(len(m.experts))]  # fmt: skip
    if stored is None or not all(e in stored for e in experts):
        stored = compute_module_sizes(skeleton, quantizer)[0]
        room = quantizer.adjust_max_memory(room)
    placed = experts_share_the_rest(skeleton, room.get("cpu", 0), stored)
    if placed is None:
        rest = stored[""] - sum(stored[e] for e in experts)
        raise QuantizationError(
            f"max_memory gives the CPU {int(room.get('cpu', 0)):,} bytes, and the modules other than experts take "
            f"{rest:,} in this quantized checkpoint: only experts can be left on disk in their quantized form. Give "
            "max_memory room for them, and the experts share what is left"
        )
    return placed


class _WithoutDiskCheck:
    """A quantizer whose environment check is skipped: it refuses "disk", which fivefold serves for experts."""

    def __init__(self, quantizer: Any) -> None:
        self._quantizer = quantizer

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._quantizer, name)


def _experts_to_leave(skeleton: nn.Module, device_map: dict, method: str) -> tuple[dict, dict[str, str]]:
    """The device map with each expert on "disk" on its layer's execution device, and those experts; a
    QuantizationError where anything else is on "disk"."""
    names = [name for name, _ in skeleton.named_parameters()]
    placed = expand_device_map(device_map, names)
    layers = {name for name, layer in skeleton.named_modules() if isinstance(layer, MixtureOfExperts)}
    runs_on = {}  # a MoE layer's execution device: where its own parameters (its router) are
    for name in names:
        if expert_of(name) is None:
            for layer in parents(name) & layers:
                runs_on.setdefault(layer, placed[name])
    left, others = {}, set()
    for name in names:
        if placed[name] != "disk":
            continue
        expert = expert_of(name)
        layer_name = expert.rpartition(".experts.")[0] if expert else None
        if layer_name in layers:
            left[expert] = runs_on.get(layer_name, "cpu")
        else:
            others.add(name.rpartition(".")[0])
    if others:
        more = f" and {len(others) - 1} more modules" if len(others) > 1 else ""
        raise QuantizationError(
            f"this checkpoint is quantized with {method}, and the device map puts {sorted(others)[0]!r}{more} on "
            '"disk": only experts can be left on disk in their quantized form (fivefold reads them from the '
            "checkpoint when they run). Give max_memory room for every other module, or place only experts on disk"
        )
    main = next((device for device in device_map.values() if device != "disk"), "cpu")
    out = {}
    for key, device in device_map.items():
        if device == "disk":  # experts of one layer (checked above) run where it runs; a key without parameters
            expert = expert_of(f"{key}.") or next((expert_of(n) for n in names if n.startswith(f"{key}.")), None)
            device = left.get(expert, main)  # (dropout, rotary's computed buffers) is placed with the rest
        out[key] = device
    return out, left
