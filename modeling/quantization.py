"""What fivefold does so that transformers' quantizers (`from_pretrained(quantization_config=...)`) quantize its
models as they quantize stock's, experts included, and never report a quantization that did not happen.

- Integrations that replace modules by exact type (`type(m) is nn.Linear`: bitsandbytes, fine-grained fp8, gguf)
  would skip fivefold's `Linear`, an `nn.Linear` subclass. Under any quantizer but those whose weights the oneDNN
  linear understands (torchao swaps only the weight tensor and keeps the module), fivefold's linears become plain
  `nn.Linear` before the quantizer sees the model: the same parameters and names; `Linear` adds no state.
- The router of a mixture of experts stays unquantized, as stock's does (its router is no `nn.Linear`): a
  quantized router flips the experts a token picks, and its weight is a few kilobytes.
- torchao's `include_input_output_embeddings=True` quantizes the input embedding table and the output head
  (`quantize_embeddings`), which transformers leaves in full precision.
- After loading, a quantizer that quantized no module raises `QuantizationError`.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers.integrations.accelerate import expand_device_map
from transformers.quantizers.quantizers_utils import should_convert_module

from .linear import Linear

# Quantization methods whose quantized weights fivefold's `Linear` runs (linear.py): it keeps its modules there.
KEEPS_FIVEFOLD_LINEAR = frozenset({"torchao"})

# Module-name patterns (transformers' `should_convert_module` syntax: a regex matched from the start of a module or
# parameter name, ending at a name boundary) that no quantizer converts.
NOT_QUANTIZED = (r".*\.router",)

# Not a quantized weight: a plain floating-point tensor, or none.
_PLAIN = (torch.Tensor, nn.Parameter)


class QuantizationError(ValueError):
    """A quantizer loaded a model without quantizing any of its modules, or was asked to quantize weights that load
    to "disk"."""


def quant_method(quantization_config: object) -> str | None:
    """The `quant_method` of a quantization config (a transformers config object or its dict in config.json)."""
    if quantization_config is None:
        return None
    if isinstance(quantization_config, dict):
        method = quantization_config.get("quant_method")
    else:
        method = getattr(quantization_config, "quant_method", None)
    return getattr(method, "value", method)  # transformers' QuantizationMethod is a str enum


def prepare_for_quantizer(model: nn.Module, quantization_config: object) -> None:
    """Called at the end of a model's construction, before a quantizer rewrites it: fivefold's linears become
    plain ones where the quantizer would skip them, and routers join the modules no quantizer converts."""
    method = quant_method(quantization_config)
    if method is None:
        return
    if method not in KEEPS_FIVEFOLD_LINEAR:
        # Those kept in fp32 stay as they are: no quantizer replaces them, and T5's `OutputProjection` casts its
        # input to its fp32 weight.
        keep = list(model._keep_in_fp32_modules or ())
        for name, module in model.named_modules():
            if isinstance(module, Linear) and should_convert_module(name, keep):
                module.__class__ = nn.Linear  # Linear and its subclasses add no state: only the forward changes
    model._keep_in_fp32_modules = {*(model._keep_in_fp32_modules or ()), *NOT_QUANTIZED}


def drop_quantization_only(dtype_plan: dict) -> dict:
    """The dtype plan (transformers' `_get_dtype_plan`) without the patterns `prepare_for_quantizer` added: they keep
    modules out of quantization, not in fp32 under fp16."""
    return {key: dtype for key, dtype in dtype_plan.items() if key not in NOT_QUANTIZED}


def quantize_embeddings(model: nn.Module) -> list[str]:
    """What torchao's `include_input_output_embeddings=True` asks for and transformers 5.24 does not do: it hands
    the input embedding table to torchao's `quantize_`, whose default filter takes linear layers only, so the table
    stays in full precision (stock's too) and a head tied to it with it. fivefold quantizes both after the load with
    the config's quantization, a tied head keeping the table's quantized weight (one int8 copy). Only what
    transformers would quantize: an `nn.Embedding` table (not a vision model's patch convolution) and an
    `nn.Linear` head; a weight shared with a module the config skips stays as it is. Returns the names of the
    modules it quantized."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or quantizer.pre_quantized or quant_method(quantizer.quantization_config) != "torchao":
        return []
    settings = quantizer.quantization_config
    config = settings.get_apply_tensor_subclass()
    if not getattr(settings, "include_input_output_embeddings", False) or type(config).__name__ == "FqnToConfig":
        return []  # per-name configs: transformers matches the names itself
    from torchao.quantization import quantize_

    skip = list(getattr(quantizer, "modules_to_not_convert", None) or ())  # the config's, and transformers' own
    asked = list(settings.modules_to_not_convert or ())  # the config's alone (transformers' name the tied copies)
    candidates = ((model.get_input_embeddings(), nn.Embedding), (model.get_output_embeddings(), nn.Linear))
    quantized = []
    for module, kind in candidates:
        weight = getattr(module, "weight", None)
        if not isinstance(module, kind) or weight is None or is_quantized_weight(weight):
            continue
        sharing = [(name, m) for name, m in model.named_modules() for p in m._parameters.values() if p is weight]
        name = next(name for name, m in sharing if m is module)
        if not should_convert_module(name, skip) or not all(should_convert_module(n, asked) for n, _ in sharing):
            continue
        quantize_(module, config, filter_fn=lambda *_: True)
        for _, holder in sharing:  # a head tied to the table holds its quantized weight
            holder._parameters["weight"] = module.weight
        quantized.append(name)
    return quantized


class _WithoutCopies:
    """A model whose `state_dict` leaves out the keys named; all else is the model's."""

    def __init__(self, model: nn.Module, left_out: set[str]) -> None:
        self._model, self._left_out = model, left_out

    def state_dict(self, *args: Any, **kwargs: Any) -> dict:
        whole = self._model.state_dict(*args, **kwargs)
        return {key: value for key, value in whole.items() if key not in self._left_out}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


@contextmanager
def saved_once(model: nn.Module) -> Iterator[None]:
    """For the block, the model's quantizer leaves out of the state dict it saves the copies of a quantized weight
    that modules share (a head tied to its quantized input table). Its state dict names a quantized weight's inner
    tensors (torchao: `lm_head._weight_qdata`), which transformers' save does not recognise as tied: it writes
    both, and loading the folder then fails comparing the two (torchao's tensors have no `equal`). Without the
    copies the folder holds the table once, and loading ties the head to it again. The model itself is left as it
    is: a forward in another thread runs as ever."""
    quantizer = getattr(model, "hf_quantizer", None)
    seen: set[int] = set()
    copies = set()
    for name, module in model.named_modules():
        weight = module._parameters.get("weight")
        if weight is None or type(weight) in _PLAIN:
            continue
        if id(weight) in seen:
            copies.add(f"{name}.weight")
        seen.add(id(weight))
    if quantizer is None or not copies:
        yield
        return
    whole = quantizer.get_state_dict_and_metadata

    def without_copies(saved: nn.Module, *args: Any, **kwargs: Any) -> tuple[dict, dict]:
        return whole(_WithoutCopies(saved, copies), *args, **kwargs)  # the quantizer flattens its state dict

    quantizer.get_state_dict_and_metadata = without_copies
    try:
        yield
    finally:
        del quantizer.get_state_dict_and_metadata  # the class's method again


def is_quantized_weight(weight: object) -> bool:
    """A weight a quantizer replaced: a tensor subclass (torchao, quanto, bitsandbytes' params) or integer data."""
    if not isinstance(weight, torch.Tensor):
        return False
    return type(weight) not in _PLAIN or not weight.is_floating_point()


def quantized_modules(model: nn.Module) -> list[str]:
    """The names of the modules of `model` holding a quantized weight (the same count for stock and fivefold)."""
    return [name for name, module in model.named_modules() if is_quantized_weight(getattr(module, "weight", None))]


def check_quantizing_to_disk(model: nn.Module, load_config: Any) -> None:
    """Raises QuantizationError when a quantizer that quantizes as it loads is given a device map it cannot load:
    a weight it would quantize on "disk", or, for torchao, any module on disk. transformers 5.24's torchao loading
    then fails on every weight it quantizes ("Torch not compiled with CUDA enabled" on a CPU build, then a report of
    failed conversions), with only the head on disk too. Other quantizers may leave what they skip on disk
    (bitsandbytes' offloaded modules). quanto refuses such a map itself. A torchao folder saved quantized may leave
    its experts on disk (prequantized_offload.py)."""
    quantizer = load_config.hf_quantizer
    device_map = load_config.device_map or {}
    if quantizer is None or quantizer.pre_quantized or "disk" not in device_map.values():
        return
    method = quant_method(quantizer.quantization_config)
    names = [name for name, _ in model.named_parameters()]
    placed = expand_device_map(device_map, names)
    disk = [name for name in names if placed[name] == "disk"]
    if method != "torchao":
        disk = [name for name in disk if quantizer.param_needs_quantization(model, name)]
    if not disk:
        return
    modules = sorted({name.rpartition(".")[0] for name in disk})
    more = f" and {len(modules) - 1} more modules" if len(modules) > 1 else ""
    raise QuantizationError(
        f'the {method} quantizer quantizes as it loads, and the device map puts {modules[0]!r}{more} on "disk", '
        "which it cannot load. Give max_memory room for the quantized model (int8 weights take a quarter of "
        "fp32's), or load without quantization_config to offload full-precision experts"
    )


def check_quantized(model: nn.Module) -> None:
    """Raises QuantizationError when `model` was loaded with a quantizer and no module of it holds a quantized
    weight (DESIGN.md: a quantizer that quantizes nothing is an error, not a silent no-op)."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or not getattr(model, "is_quantized", False) or quantized_modules(model):
        return
    method = quant_method(quantizer.quantization_config)
    raise QuantizationError(
        f"the {method} quantizer quantized no module of {type(model).__name__}: every linear layer is still in "
        "full precision. Check the quantization config's modules_to_not_convert / skip lists, and that this "
        f"{method} release supports these layers on this device"
    )
