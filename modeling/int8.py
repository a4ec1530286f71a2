"""Weight-only int8 linears on the CPU through torch's own kernel, for weights torchao's quantizer made.

`TorchAoConfig(Int8WeightOnlyConfig())` swaps each linear's weight for an `Int8Tensor` (per-row int8 `qdata`
[O, C] and `scale` [O, 1]) and keeps the module. Its own CPU path converts the whole int8 weight to the
activations' dtype on every call and multiplies in floating point: it reads the int8 weight, writes and reads a
full-precision copy, and decodes slower than fp32. `torch.ops.aten._weight_int8pack_mm` multiplies by the int8
weight directly (x @ (qdata * scale).T, the same sums as torchao's up to the order of fp32 rounding), so a
decoding step reads one byte a weight. torch vectorises that kernel with AVX-512 and better; on AVX2 it runs
a scalar loop, slower than torchao's path, so there the path stays off (`INT8PACK_CAPABILITIES`).

torchao is never imported: its weights are recognised by what they hold. Dynamic int8 (activations quantized
too) stays on torchao's path, which already multiplies in int8 (`torch._int_mm`).

Shapes: N tokens (B * T), C channels (the input features), O head outputs (the output features).
"""

import torch

# torch.backends.cpu.get_cpu_capability() values under which _weight_int8pack_mm is vectorised.
INT8PACK_CAPABILITIES = frozenset({"AVX512", "AVX512_BF16", "AVX512_VNNI", "AMX", "AVX512_AMX"})
_INT8PACK = getattr(getattr(torch.ops, "aten", None), "_weight_int8pack_mm", None)


def _capability() -> str:
    probe = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return probe() if probe is not None else ""


INT8PACK_ON = _INT8PACK is not None and _capability() in INT8PACK_CAPABILITIES


def int8_weight_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(qdata [O, C] int8, scale [O]) of a torchao per-row, symmetric, weight-only int8 weight; None for any other
    weight (dynamic activation quantization, groups, zero points, pre-scales)."""
    qdata, scale = getattr(weight, "qdata", None), getattr(weight, "scale", None)
    if not (isinstance(qdata, torch.Tensor) and isinstance(scale, torch.Tensor)) or qdata.dtype != torch.int8:
        return None
    if (
        qdata.dim() != 2
        or scale.numel() != qdata.shape[0]
        or list(getattr(weight, "block_size", [])) != [1, qdata.shape[1]]
    ):
        return None
    if any(getattr(weight, name, None) is not None for name in ("act_quant_kwargs", "act_pre_scale")):
        return None
    zero_point = getattr(weight, "zero_point", None)
    if zero_point is not None and bool(zero_point.any()):
        return None
    return qdata, scale.reshape(-1)


def int8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """`F.linear(x, weight, bias)` through `_weight_int8pack_mm` for a torchao int8 weight-only weight on the CPU
    where the kernel is vectorised; None where it does not apply (the caller then runs F.linear)."""
    if not INT8PACK_ON or not x.is_cpu or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return None
    parts = int8_weight_parts(weight)
    if parts is None or not parts[0].is_cpu:
        return None
    qdata, scale = parts
    y = _INT8PACK(x.reshape(-1, x.shape[-1]).contiguous(), qdata.contiguous(), scale.to(x.dtype))  # [N, O]
    y = y.reshape(*x.shape[:-1], qdata.shape[0])
    return y if bias is None else y + bias.to(y.dtype)
