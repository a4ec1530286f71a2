"""An expert's parameters from the tensors a checkpoint stores, quantized ones included.

A model quantized with torchao and saved (`save_pretrained` after `from_pretrained(..., quantization_config=
TorchAoConfig(...))`) stores each quantized weight as several tensors, `gate_proj._weight_qdata` (int8),
`gate_proj._weight_scale`, ..., and describes the weight in the file's metadata (its torchao class and attributes,
as JSON under the parameter's name). An expert the cache reads from such a checkpoint reads those tensors in their
stored dtypes, a quarter of fp32's bytes for int8, and rebuilds the weight torchao made: the same tensor a load of
the whole model gives, run by fivefold's int8 linears (int8.py) as that one is.

bitsandbytes stores a 4-bit weight under its own name, packed two values a byte, with its quantization state beside
it (`gate_proj.weight.absmax`, `.quant_map`, `.quant_state.bitsandbytes__nf4`, and `.nested_absmax`,
`.nested_quant_map` under double quantization): an expert read from such a checkpoint reads those, an eighth of
fp32's bytes and a little more, and rebuilds bitsandbytes' `Params4bit` from them as its own loading does.
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .expert_store import FileTensor, MemoryTensor


class QuantizedParts:
    """An expert's parameters, each made of the stored tensors its torchao description names (or, for a parameter
    stored plain, the tensor of its own name)."""

    def __init__(self, shapes: dict[str, tuple[torch.Size, torch.dtype]], described: dict[str, str | None]) -> None:
        self.shapes = shapes
        self.described = described  # {parameter: torchao's JSON description, or None where stored plain}
        self.parts = {name: stored_parts(name, described[name]) for name in shapes}

    def stored_names(self, parameter: str | None = None) -> list[str]:
        if parameter is not None:
            return self.parts[parameter]
        return [part for parts in self.parts.values() for part in parts]

    def device_bytes(self, sources: dict) -> int:
        """A quantized weight holds its stored tensors; a plain one, its shape in its dtype."""
        total = 0
        for name, (shape, dtype) in self.shapes.items():
            if self.described[name] is None:
                total += shape.numel() * dtype.itemsize
            else:
                total += sum(_stored_bytes(sources[part]) for part in self.parts[name])
        return total

    def __call__(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The parameters whose stored tensors are all in `tensors`."""
        from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

        out = {}
        for name, parts in self.parts.items():
            if not all(part in tensors for part in parts):
                continue
            description = self.described[name]
            if description is None:
                out[name] = tensors[name].to(self.shapes[name][1])
                continue
            # torchao's own rebuild, under a prefix that gives every name a module part (it splits at the last dot)
            data = {f"expert.{part}": tensors[part] for part in parts}
            metadata = {"tensor_names": json.dumps([f"expert.{name}"]), f"expert.{name}": description}
            rebuilt, _ = unflatten_tensor_state_dict(data, metadata)
            out[name] = rebuilt[f"expert.{name}"]
        return out


# The suffixes bitsandbytes stores beside a 4-bit weight's name (`QuantState.as_dict(packed=True)`): a read of the
# weight must include them, as its rebuild does.
_BNB_4BIT_STATE = (
    "absmax", "quant_map", "nested_absmax", "nested_quant_map",
    "quant_state.bitsandbytes__nf4", "quant_state.bitsandbytes__fp4",
)  # fmt: skip


class FourBitParts:
    """An expert's parameters from a bitsandbytes 4-bit checkpoint: a weight from its packed data and the state
    stored beside it, a parameter stored plain (a bias) from its own tensor."""

    def __init__(self, shapes: dict[str, tuple[torch.Size, torch.dtype]], states: dict[str, list[str]]) -> None:
        self.shapes = shapes
        self.states = states  # {parameter: the suffixes of its stored state; none where stored plain}

    def stored_names(self, parameter: str | None = None) -> list[str]:
        names = [parameter] if parameter is not None else list(self.shapes)
        return [part for name in names for part in [name, *(f"{name}.{s}" for s in self.states[name])]]

    def device_bytes(self, sources: dict) -> int:
        return sum(
            sum(_stored_bytes(sources[part]) for part in self.stored_names(name))
            if self.states[name]
            else shape.numel() * dtype.itemsize
            for name, (shape, dtype) in self.shapes.items()
        )

    def __call__(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from bitsandbytes.nn import Params4bit

        out = {}
        for name, states in self.states.items():
            if not all(part in tensors for part in self.stored_names(name)):
                continue
            if not states:
                out[name] = tensors[name].to(self.shapes[name][1])
                continue
            data = tensors[name]
            stats = {state: tensors[f"{name}.{state}"] for state in states}
            out[name] = Params4bit.from_prequantized(data, stats, requires_grad=False, device=data.device)
        return out


def stored_parts(parameter: str, description: str | None) -> list[str]:
    """The names of the stored tensors a parameter is made of: `owner._leaf_qdata`, ... for a torchao tensor."""
    if description is None:
        return [parameter]
    owner, _, leaf = parameter.rpartition(".")
    prefix = f"{owner}._{leaf}_" if owner else f"_{leaf}_"
    return [prefix + data for data in json.loads(description)["_tensor_data_names"]]


def expert_sources(
    module: nn.Module, prefix: str, stored: dict[str, FileTensor], metadata: dict[str, str]
) -> tuple[dict[str, FileTensor], Any] | None:
    """Where each stored tensor of the expert `module` (its parameters under `prefix` in the checkpoint) lies, and
    how they make its parameters (None: each its own tensor); None where the checkpoint does not hold them all, or
    holds them in another shape."""
    shapes = {name: (p.shape, p.dtype) for name, p in module.named_parameters()}
    four_bit = {name: [s for s in _BNB_4BIT_STATE if f"{prefix}{name}.{s}" in stored] for name in shapes}
    if any(four_bit.values()):
        parts = FourBitParts(shapes, four_bit)
    else:
        parts = QuantizedParts(shapes, {name: _torchao_description(metadata.get(prefix + name)) for name in shapes})
    sources = {part: stored.get(prefix + part) for part in parts.stored_names()}
    if any(source is None for source in sources.values()):
        return None
    plain = [name for name in shapes if parts.stored_names(name) == [name]]
    if any(sources[name].entry.shape != tuple(shapes[name][0]) for name in plain):
        return None
    quantized = [part for name in shapes if name not in plain for part in parts.stored_names(name)]
    for part in quantized:  # torch's int8 kernel wants its data on a 64-byte boundary
        sources[part].aligned = True
    return sources, (parts if quantized else None)


def _torchao_description(description: str | None) -> str | None:
    """The description of a tensor torchao stored in parts; None for a plain one (or none)."""
    if description is None:
        return None
    try:
        parsed = json.loads(description)
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or parsed.get("_type") in (None, "Tensor") or "_tensor_data_names" not in parsed:
        return None
    return description


def leaf_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold a tensor's data: itself, or for a tensor subclass holding others (a quantized
    weight's data, scales and zero points), theirs; a bitsandbytes 4-bit weight, its packed data and the tensors of
    its quantization state (scales, code book, and theirs under double quantization)."""
    if not is_traceable_wrapper_subclass(tensor):
        state = getattr(tensor, "quant_state", None)
        return [tensor, *(_state_tensors(state) if state is not None else [])]
    inner, _ = tensor.__tensor_flatten__()
    return [leaf for name in inner for leaf in leaf_tensors(getattr(tensor, name))]


def _state_tensors(state: Any) -> list[torch.Tensor]:
    found = [value for value in vars(state).values() if isinstance(value, torch.Tensor)]
    nested = getattr(state, "state2", None)
    return found + (_state_tensors(nested) if nested is not None else [])


def held_bytes(tensor: torch.Tensor) -> int:
    """The bytes a tensor holds: for a quantized one, those of its data and scales, not its shape in the dtype it
    stands for."""
    return sum(leaf.numel() * leaf.element_size() for leaf in leaf_tensors(tensor))


def _stored_bytes(source: FileTensor | MemoryTensor) -> int:
    return source.tensor.nbytes if isinstance(source, MemoryTensor) else source.nbytes


@contextmanager
def offloaded_parts_saved(model: nn.Module) -> Iterator[None]:
    """For the block, the state dict the model saves names the stored tensors of each quantized expert the cache
    serves, cached or not (on meta, which transformers' save reads back one at a time through the expert's hook;
    bitsandbytes' few bytes of state read now), described as the checkpoint describes them: the expert is saved as
    it is stored, never read whole into memory, nor saved as an empty full-precision weight."""
    cache, quantizer = getattr(model, "expert_cache", None), getattr(model, "hf_quantizer", None)
    if cache is None or quantizer is None:
        yield
        return
    previous = quantizer.__dict__.get("get_state_dict_and_metadata")
    whole = quantizer.get_state_dict_and_metadata

    def with_stored_parts(saved: nn.Module, *args: Any, **kwargs: Any) -> tuple[dict, dict]:
        state_dict, metadata = whole(saved, *args, **kwargs)
        if state_dict is None:  # what transformers then saves (bitsandbytes' quantizer leaves it to the model)
            state_dict = saved.state_dict()
        for expert in cache.experts.values():
            if not isinstance(expert.assemble, QuantizedParts | FourBitParts):
                continue  # cached ones too: bitsandbytes repacks a 4-bit weight it runs on the CPU, and unpacks it
                # to save in another layout than the checkpoint's (bf16 scales), which then loads to other outputs
            prefix = f"{expert.layer}.experts.{expert.index}."
            for name in expert.shapes:
                stored = expert.assemble.stored_names(name)
                if stored == [name]:
                    continue
                state_dict.pop(prefix + name, None)
                for part in stored:
                    if part != name and isinstance(expert.assemble, FourBitParts):
                        # bitsandbytes' state is named below its weight, where transformers' read-back of an
                        # offloaded tensor looks for a module and fails; it is a few hundred bytes, read now
                        state_dict[prefix + part] = expert.sources[part].read()
                        continue
                    entry = expert.sources[part].entry
                    parts[prefix + part] = torch.empty(entry.shape, dtype=entry.dtype, device="meta")
                    state_dict[prefix + part] = parts[prefix + part]
                if isinstance(expert.assemble, QuantizedParts):
                    metadata[prefix + name] = expert.assemble.described[name]
        return state_dict, metadata

    parts: dict[str, torch.Tensor] = {}
    model.offloaded_parts = parts  # what `get_parameter_or_buffer` answers for them while the save runs
    quantizer.get_state_dict_and_metadata = with_stored_parts
    try:
        yield
    finally:
        del model.offloaded_parts
        if previous is None:
            del quantizer.get_state_dict_and_metadata
        else:
            quantizer.get_state_dict_and_metadata = previous
