"""int8 linears on the CPU through torch's own kernels, for weights torchao's quantizer made (weight-only and dynamic).

`TorchAoConfig(Int8WeightOnlyConfig())` swaps each linear's weight for an `Int8Tensor` (per-row int8 `qdata`
[O, C] and `scale` [O, 1]) and keeps the module. Its own CPU path converts the whole int8 weight to the
activations' dtype on every call and multiplies in floating point, which decodes slower than fp32.
`torch.ops.aten._weight_int8pack_mm` multiplies by the int8 weight directly (x @ (qdata * scale).T, with x and the
sums rounded to bf16: the kernel is vectorised for bf16 activations only, from AVX2 on), so a decoding step reads
one byte a weight (an AVX2-only Zen 3: 9.4 GB/s of int8 weights, fp32's F.linear 14 of fp32 ones, torchao's 0.4).

Under torch.compile, torchao's weight-only product traces as a dequantization and a full-precision matmul, which
freezing folds back into full-precision constants. `traced_int8_linear` hands dynamo the int8 product itself, which
inductor lowers to the aten kernel or (frozen weights, `max-autotune`) to an int8 GEMM streaming at DRAM speed.

`Int8DynamicActivationInt8WeightConfig()` quantizes the activations too, per row and symmetrically, at every call.
torchao's path multiplies in int8 (`torch._int_mm`) but spends more time around the product than in it (a dozen
ops a call for the scales and rounding; on a CPU with VNNI but no AMX, a shift to uint8 and a correction summing
the whole weight). `int8_dynamic_linear` runs the same arithmetic in a few ops (results equal torchao's bit for
bit): MiniLM's full 8 x 128 batch in 58-66 ms against torchao's 192 (Zen 4, AVX-512 VNNI, 2 threads; fp32 149).
Where oneDNN's quantized linear multiplies exactly, the products go through it (onednn_int8.py); where it does
not, this path is traced too, since inductor would lower torchao's product to that kernel.

torchao is never imported: its weights are recognised by what they hold.

Shapes: N tokens (B * T), C channels (the input features), O head outputs (the output features).
"""

import functools
import threading
import weakref

import torch

from .onednn_int8 import exact_int8_sums, int8_kernels_saturate, qlinear_on, sums_in_fp32, unsigned
from .operand_weights import operand_int8_product, operand_weights

# torch.backends.cpu.get_cpu_capability() values under which _weight_int8pack_mm is vectorised.
INT8PACK_CAPABILITIES = frozenset({"AVX2", "AVX512", "AVX512_BF16", "AVX512_VNNI", "AMX", "AVX512_AMX"})
_INT8PACK = getattr(getattr(torch.ops, "aten", None), "_weight_int8pack_mm", None)
_ACTIVATIONS = (torch.float32, torch.bfloat16, torch.float16)
# The kernel multiplies row by row, bound by its arithmetic; torchao's own path (the weight converted at every call,
# then aten's fp32 GEMM) is faster past ~64 rows in GPT-2's forward, ~160 for an 8192 x 2048 weight (AVX2 Zen 3,
# fp32; `benchmarks/int8_rows.py --rows`). fp32 activations past max(64, weights / 100,000) rows take that path.
INT8PACK_MIN_ROWS, INT8PACK_WEIGHTS_A_ROW = 64, 100_000


def _capability() -> str:
    probe = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return probe() if probe is not None else ""


INT8PACK_ON = _INT8PACK is not None and _capability() in INT8PACK_CAPABILITIES


def _is_int8_tensor(weight: torch.Tensor) -> bool:
    """torchao's `Int8Tensor`, by name: its other int8 holders keep torchao's own path (fields not read here)."""
    return type(weight).__name__ == "Int8Tensor"


# What was found for each weight, by id, dropped when the weight is collected: the checks (a read of every zero
# point among them) cost more than GPT-2's smaller int8 products at one row. torchao's int8 tensors are not changed
# in place, so one finding holds for the weight's life.
_FOUND: dict[tuple[str, int], tuple[weakref.ref, tuple | None]] = {}


def _once_per_weight(kind: str, weight: torch.Tensor, find) -> tuple | None:
    """`find(weight)`, computed on the first call for this weight and remembered until it is collected."""
    key = (kind, id(weight))
    found = _FOUND.get(key)
    if found is not None and found[0]() is weight:
        return found[1]
    result = find(weight)
    _FOUND[key] = (weakref.ref(weight), result)
    weakref.finalize(weight, _FOUND.pop, key, None)
    return result


def _per_row_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(qdata [O, C] int8, scale [O]) of an `Int8Tensor` quantized per row and symmetrically; None otherwise."""
    if not _is_int8_tensor(weight):
        return None
    return _once_per_weight("per-row", weight, _read_per_row_int8)


@torch.compiler.assume_constant_result
def _is_per_row_int8(weight: torch.Tensor) -> bool:
    """`_per_row_int8(weight) is not None`, a constant to a tracer, found on the real weight (its zero points)."""
    return _per_row_int8(weight) is not None


def _read_per_row_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    qdata, scale = getattr(weight, "qdata", None), getattr(weight, "scale", None)
    if not (isinstance(qdata, torch.Tensor) and isinstance(scale, torch.Tensor)) or qdata.dtype != torch.int8:
        return None
    if (
        qdata.dim() != 2
        or scale.numel() != qdata.shape[0]
        or list(getattr(weight, "block_size", [])) != [1, qdata.shape[1]]
    ):
        return None
    zero_point = getattr(weight, "zero_point", None)
    if zero_point is not None and bool(zero_point.any()):
        return None
    return qdata.contiguous(), scale.reshape(-1)


def int8_weight_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(qdata [O, C] int8, scale [O]) of a torchao per-row, symmetric, weight-only int8 weight; None for any other
    weight (dynamic activation quantization, groups, zero points, pre-scales, other tensor subclasses)."""
    if any(getattr(weight, name, None) is not None for name in ("act_quant_kwargs", "act_pre_scale")):
        return None
    return _per_row_int8(weight)


@functools.lru_cache(maxsize=64)
def _unit_scales(rows: int) -> torch.Tensor:  # the kernel's scales, the real ones applied after it
    return torch.ones(rows, dtype=torch.bfloat16)


# A traced graph's unit scales, sliced from one constant: inductor's fallback to the aten kernel (torch 2.13) fails on
# scales the graph computes (a `torch.ones` of its own), and dynamo reads a cache of them as it was when first read.
_TRACED_UNIT_SCALES = torch.ones(1 << 18, dtype=torch.bfloat16)


def int8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """`F.linear(x, weight, bias)` through torch's int8 kernels for a torchao int8 weight on the CPU, dynamic or
    weight-only; None where neither applies (the caller then runs F.linear, which runs torchao's own path)."""
    if getattr(weight, "act_quant_kwargs", None) is not None:
        return int8_dynamic_linear(x, weight, bias)
    return int8_weight_only_linear(x, weight, bias)


def int8_weight_only_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """`F.linear(x, weight, bias)` through `_weight_int8pack_mm` for a torchao int8 weight-only weight on the CPU
    where the kernel is vectorised; None where it does not apply, or where torchao's path is faster (many rows)."""
    if not INT8PACK_ON or not x.is_cpu or x.dtype not in _ACTIVATIONS:
        return None
    packed = _once_per_weight("int8pack", weight, _int8pack_operands)
    if packed is None:
        return None
    limit = max(INT8PACK_MIN_ROWS, packed[0].numel() // INT8PACK_WEIGHTS_A_ROW)  # (rows)
    if x.dtype == torch.float32 and x.numel() > limit * x.shape[-1]:
        return None
    return _int8pack_product(x, *packed, bias)


def _int8pack_product(
    x: torch.Tensor,
    qdata: torch.Tensor,
    unit_scales: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    operands: bool = False,
) -> torch.Tensor:
    """x @ (qdata * scale).T + bias through `_weight_int8pack_mm`, eager or traced; with `operands`, traced where
    the weights are a graph's operands (operand_weights.py)."""
    dtype = x.dtype
    # The kernel is vectorised for bf16 activations only (fp32 ones: a scalar loop, 5-10x slower than fp32's
    # F.linear; bf16 ones 3-8x faster than it, Zen 5), so the scales are applied after, in x's dtype: bf16 rounds x
    # and the sums (2^-9 relative), no coarser than the int8 weights themselves (2^-8 of a row's largest weight).
    x16 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = operand_int8_product(x16, qdata) if operands else None
    if y is None:
        y = _INT8PACK(x16, qdata, unit_scales)  # [N, O] bf16
    if dtype != torch.float32:  # bf16 and fp32 promote to fp32, which is x's dtype; fp16 would too
        y = y.to(dtype)
    # The dtype tests cost a tenth of the `.to` calls they save (a SmolLM2-sized decoding step: 210 of these).
    scale = scale if scale.dtype == dtype else scale.to(dtype)
    if bias is None:
        y = torch.mul(y, scale)
    else:
        y = torch.addcmul(bias if bias.dtype == dtype else bias.to(dtype), y, scale)
    return y.reshape(*x.shape[:-1], qdata.shape[0])


@torch.compiler.assume_constant_result
def _int8pack_takes(weight: torch.Tensor) -> bool:
    """Whether `_weight_int8pack_mm` may multiply by this weight: found on the real weight while tracing (a fake
    tensor knows neither its alignment nor its zero points' values), a constant of the graph."""
    return INT8PACK_ON and _once_per_weight("int8pack", weight, _int8pack_operands) is not None


def traced_int8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """`int8_weight_only_linear` written for dynamo: the same arithmetic (at every row count), on the weight's own
    int8 data rather than operands found once per weight (a dictionary a graph cannot read). Inductor lowers
    `_weight_int8pack_mm` to its aten kernel, or, under freezing and `max-autotune`, to its own int8 GEMM for the
    weight's shape, reading int8 weights at twice the aten kernel's rate at one row (Zen 4). A dynamic weight runs
    `int8_dynamic_linear`'s arithmetic where oneDNN's quantized linear saturates (onednn_int8.py), and elsewhere
    torchao's own product, which inductor lowers to that kernel. None where the weight is not one it takes."""
    if traced_int8_takes(x, weight):
        qdata, scale = weight.qdata, weight.scale.reshape(-1)
        unit = _TRACED_UNIT_SCALES[: qdata.shape[0]]
        return _int8pack_product(x, qdata, unit, scale, bias, operands=operand_weights())
    if x.dtype != torch.float32 or not x.is_cpu or not _saturating_kernel_would_take(weight):
        return None
    q, scale = _quantize_rows(x.reshape(-1, x.shape[-1]))
    y = _int8_product(q, None, scale, weight.qdata, weight.scale.reshape(-1), bias)
    return y.reshape(*x.shape[:-1], y.shape[-1])


@torch.compiler.assume_constant_result  # read on the real weight, as `_int8pack_takes`
def _saturating_kernel_would_take(weight: torch.Tensor) -> bool:
    return int8_kernels_saturate() and int8_dynamic_parts(weight) is not None


def traced_int8_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `traced_int8_linear` multiplies x by this weight: the graph then holds the weight's plain int8 data
    and scales rather than the weight itself."""
    return (
        x.is_cpu
        and x.dtype in _ACTIVATIONS
        and weight.shape[0] <= _TRACED_UNIT_SCALES.numel()
        and _int8pack_takes(weight)
    )


def _int8pack_operands(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(qdata [O, C] int8, unit scales [O] bf16, scale [O]) for `_weight_int8pack_mm`, or None where the kernel must
    not take this weight."""
    parts = int8_weight_parts(weight)
    # The bf16 kernel reads past a row whose width is no multiple of 16, and crashes on int8 data not aligned to 16
    # bytes (weights memory-mapped from a file: torch 2.13 on AVX-512); those weights keep torchao's path. Asked:
    # the 64-byte alignment torch gives what it allocates.
    if parts is None or not parts[0].is_cpu or parts[0].shape[1] % 16 or parts[0].data_ptr() % 64:
        return None
    return parts[0], _unit_scales(parts[0].shape[0]), parts[1]


def int8_dynamic_parts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(qdata [O, C] int8, scale [O]) of a torchao int8 weight whose activations are quantized at each call per row
    and symmetrically, as `Int8DynamicActivationInt8WeightConfig()` makes them; None for any other weight (a
    static activation scale, a pre-scale, a reduced range, asymmetric activations or weights, groups, other tensor
    subclasses)."""
    kwargs = getattr(weight, "act_quant_kwargs", None)
    if kwargs is None:
        return None
    granularity = getattr(kwargs, "granularity", None)
    if (
        type(granularity).__name__ != "PerRow"
        or getattr(granularity, "dim", None) not in (-1, None)
        or getattr(getattr(kwargs, "mapping_type", None), "name", None) != "SYMMETRIC"
        or getattr(kwargs, "reduce_range", False)
        or getattr(weight, "reduce_range", False)
        or any(getattr(weight, name, None) is not None for name in ("act_quant_scale", "act_pre_scale"))
    ):
        return None
    return _per_row_int8(weight)


# torchao's floor under an activation row's scale (Int8Tensor.from_hp), and the half-range its scale divides by.
_EPS = torch.finfo(torch.float32).eps
_HALF_RANGE = (127 - (-128)) / 2


# The dynamic path's intermediates (x scaled, x rounded to int8, the int32 sums) live only inside one call, and fresh
# buffers of that size go back to the system when freed (glibc), so every forward paid their page faults again:
# 10,000 a MiniLM 8 x 128 forward, a fifth of its time (Zen 4). So each thread keeps one buffer of each kind for
# its life, up to SCRATCH_BYTES a buffer (at most 3 x 32 MiB a thread; 0 turns the reuse off; larger ones stay
# fresh, or a long prefill's would stay held). Traced, they are the graph's own.
SCRATCH_BYTES = 32 << 20
_SCRATCH = threading.local()


def _scratch(kind: str, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised [shape] tensor of `dtype`, the calling thread's own buffer `kind` where it fits."""
    numel = shape[0] * shape[1]
    if numel * dtype.itemsize > SCRATCH_BYTES or torch.compiler.is_compiling():
        return torch.empty(shape, dtype=dtype)
    buffer = getattr(_SCRATCH, kind, None)
    if buffer is None or buffer.numel() < numel:
        with torch.inference_mode(False):  # written to again outside an inference-mode block too
            buffer = torch.empty(numel, dtype=dtype)
        setattr(_SCRATCH, kind, buffer)
    return buffer[:numel].view(shape)


def int8_dynamic_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """`F.linear(x, weight, bias)` for a torchao dynamic int8 weight on fp32 activations on the CPU, as torchao
    computes it: each row of x scaled by its largest magnitude / 127.5 (at least eps), rounded to int8, multiplied
    in int8 with int32 sums, then scaled back by the row's and the output's scales. None where it does not apply."""
    found = int8_dynamic_linears(x, [(weight, bias)])
    return None if found is None else found[0]


def int8_dynamic_linears(
    x: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor | None]]
) -> list[torch.Tensor] | None:
    """`[F.linear(x, weight, bias) for weight, bias in layers]` as `int8_dynamic_linear` computes each, with x
    quantized once for all of them (attention's query, key and value read one input): the same results, bit for
    bit. None unless every weight is a dynamic int8 one this path takes."""
    if x.dtype != torch.float32 or not x.is_cpu or (torch.is_grad_enabled() and x.requires_grad):
        return None  # the int8 product has no derivative
    parts = []
    for weight, _ in layers:
        found = int8_dynamic_parts(weight)
        if found is None or not found[0].is_cpu:
            return None
        parts.append(found)
    rows = x.reshape(-1, x.shape[-1])  # [N, C]
    q, scale = _quantize_rows(rows)
    shifted = unsigned(q, _scratch("unsigned", rows.shape, torch.uint8)) if qlinear_on() else None
    outputs = []
    for (qdata, w_scale), (_, bias) in zip(parts, layers, strict=True):
        y = _int8_product(q, shifted, scale, qdata, w_scale, bias)
        outputs.append(y.reshape(*x.shape[:-1], qdata.shape[0]))
    return outputs


def _quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [N, C] fp32 -> (int8 [N, C] in this thread's buffer, scale [N, 1]), torchao's per-row symmetric
    quantization."""
    # The largest magnitude as max(-min, max), and the rounding in place: a fresh [N, C] float buffer costs its page
    # faults (abs().amax() makes one; aminmax is 10x slower than both reductions).
    largest = torch.maximum(-rows.amin(-1, keepdim=True), rows.amax(-1, keepdim=True))  # [N, 1]
    scale = (largest / _HALF_RANGE).clamp_(min=_EPS)  # [N, 1]
    scaled = torch.mul(rows, torch.reciprocal(scale), out=_scratch("scaled", rows.shape, torch.float32))  # [N, C]
    return _scratch("rounded", rows.shape, torch.int8).copy_(scaled.round_().clamp_(-128, 127)), scale


def _int8_product(
    q: torch.Tensor,
    shifted: torch.Tensor | None,
    scale: torch.Tensor,
    qdata: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """q [N, C] int8 (rows scaled by scale [N, 1]; `shifted`, the same as uint8 + 128, or None) by qdata [O, C] int8
    (rows scaled by w_scale [O]) + bias -> [N, O] fp32."""
    # oneDNN's kernel where exact, or an fp32 product where it saturates (onednn_int8.py); else `_int_mm`.
    y = exact_int8_sums(shifted, qdata) if shifted is not None else sums_in_fp32(q, qdata)
    if y is None:
        y = torch._int_mm(q, qdata.t(), out=_scratch("sums", (q.shape[0], qdata.shape[0]), torch.int32)).float()
    y = y.mul_(scale).mul_(w_scale if w_scale.dtype == torch.float32 else w_scale.float())
    if bias is not None:
        y += bias
    return y


def int8_embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """`F.embedding(ids, weight)` for a torchao per-row int8 table on the CPU: only the rows asked for, each scaled
    back as torchao dequantizes (int8 to the table's dtype, times the row's scale), so the result is torchao's bit
    for bit. torchao's own path dequantizes the whole table at every call: 155 ms a decoding step's lookup in
    GPT-2's 50,257 x 768 table (Zen 4), against microseconds here. None where it does not apply."""
    if not (ids.is_cpu and weight.is_cpu and weight.dtype.is_floating_point) or not _is_per_row_int8(weight):
        return None
    qdata, scale = weight.qdata, weight.scale.reshape(-1)
    flat = ids.reshape(-1)  # index_select, not indexing: a negative id is an IndexError, as in F.embedding
    rows = torch.index_select(qdata, 0, flat).to(weight.dtype)  # [N, C]
    looked_up = (rows * torch.index_select(scale, 0, flat).unsqueeze(-1)).to(weight.dtype)
    return looked_up.reshape(*ids.shape, qdata.shape[1])
