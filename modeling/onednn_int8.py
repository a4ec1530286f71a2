"""The int8 products of dynamic int8 linears (int8.py) through oneDNN's quantized linear, where it multiplies
exactly.

`torch._int_mm` returns int32 sums, which the caller converts to fp32: a fresh [N, O] tensor, whose page faults
cost more than the product itself (1.07 ms for a 1024 x 384 by 384 product that takes 0.10 ms, Xeon with AMX, 2
threads). oneDNN's quantized linear (`onednn::qlinear_pointwise`, what inductor lowers these products to on a CPU
with AMX) writes the fp32 sums directly, from a weight packed once for its kernels: 0.10 ms in all for that
product, 0.39 against 4.1 ms for MiniLM's 1024 x 384 by 1536. With unit scales and the activations as uint8 with
zero point 128 (the int8 values shifted), its outputs are the int32 sums converted to fp32, bit for bit: the caller
then scales them as before, so the results stay torchao's.

oneDNN takes unsigned activations. On a CPU without VNNI or AMX its u8 x s8 kernel adds pairs of products in 16
bits, which saturate, so the path checks once, on the worst case, that its sums equal `torch._int_mm`'s, and stays
off where they do not (or where torch has no oneDNN). Inductor does not check: under freezing its x86 lowering
rewrites torchao's dynamic int8 product (`torch._int_mm` by a constant weight, then the scales) into that kernel on
any CPU, so there int8.py traces its own product (`sums_in_fp32`).
"""

import functools
import weakref

import torch

_OPS = getattr(torch.ops, "onednn", None)
# False: every product through `torch._int_mm`. The packed weights are a copy as large as the int8 weights, which a
# dynamic int8 model then holds twice (MiniLM: 22 MB more); switched off before a model's first forward, it packs
# none.
ON = True

# Packed weights by the int8 data's id, with the data's version when packed (`load_state_dict` copies new values
# into it), dropped when the data is collected.
_PACKED: dict[int, tuple[weakref.ref, int | None, torch.Tensor]] = {}


@functools.cache
def qlinear_exact() -> bool:
    """Whether oneDNN's quantized linear runs here and returns `torch._int_mm`'s sums exactly: checked once, on
    the products that saturate 16-bit pairs (the largest activations by the largest weights), for several rows and
    for one (decoding's), and on sums past fp32's 2^24 (a zero point applied after the conversion would show)."""
    try:
        return all(_exact_on_the_worst_case(rows, width) for rows, width in ((4, 64), (1, 64), (3, 2048)))
    except (AttributeError, RuntimeError, NotImplementedError):  # no oneDNN, or no such kernel on this CPU
        return False


def _exact_on_the_worst_case(rows: int, width: int) -> bool:
    q = torch.full((rows, width), 127, dtype=torch.int8)  # 255 once shifted
    q[1::2] = -128
    weight = torch.full((16, width), 127, dtype=torch.int8)
    weight[1::2] = -128
    expected = torch._int_mm(q, weight.t())
    got = _qlinear(unsigned(q), torch.ops.onednn.qlinear_prepack(weight, None), weight.shape[0])
    return bool(torch.equal(got, expected.to(torch.float32)))


def qlinear_on() -> bool:
    """Whether products go through oneDNN's quantized linear: switched on (`ON`, and torch's oneDNN), and exact
    here."""
    return ON and torch.backends.mkldnn.enabled and qlinear_exact()


def unsigned(q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """int8 [N, C] as the uint8 values q + 128 (the sign bit flipped), which oneDNN reads with zero point 128."""
    return torch.bitwise_xor(q.view(torch.uint8), 0x80, out=out)


def exact_int8_sums(q_unsigned: torch.Tensor, qdata: torch.Tensor) -> torch.Tensor | None:
    """The sums of (q_unsigned - 128) [N, C] by qdata [O, C] int8, as fp32 [N, O]; None where oneDNN's kernel does
    not multiply exactly here, or under a tracer (inductor lowers `torch._int_mm` itself)."""
    if torch.compiler.is_compiling() or not qdata.is_cpu or not qlinear_on():
        return None
    return _qlinear(q_unsigned, _packed(qdata), qdata.shape[0])


@torch.compiler.assume_constant_result
def int8_kernels_saturate() -> bool:
    """`not qlinear_exact()`, which a tracer takes as a constant."""
    return not qlinear_exact()


# fp32 adds integers exactly below 2^24: 1,024 channels of products of at most 128 x 128.
_EXACT_CHANNELS = 1024


def sums_in_fp32(q: torch.Tensor, qdata: torch.Tensor) -> torch.Tensor | None:
    """The sums of q [N, C] int8 by qdata [O, C] int8 as fp32 [N, O], multiplied in fp32, where oneDNN's int8
    kernels saturate (no VNNI or AMX): torch's `_int_mm` is a plain loop there (314 ms for 1024 x 384 by 1536 on an
    AVX2-only Zen 3; this, 9). Exact: 1,024 channels at a time, added as int32 past that, so the result is
    `_int_mm`'s converted to fp32, bit for bit. Traced, it also keeps inductor from rewriting `_int_mm` into
    oneDNN's kernel there (freezing then holds the weights as fp32 constants). None elsewhere."""
    if not int8_kernels_saturate():
        return None
    chunks = [
        torch.mm(
            q[:, i : i + _EXACT_CHANNELS].to(torch.float32), qdata[:, i : i + _EXACT_CHANNELS].to(torch.float32).t()
        )
        for i in range(0, max(q.shape[1], 1), _EXACT_CHANNELS)
    ]
    if len(chunks) == 1:
        return chunks[0]
    return torch.stack([chunk.to(torch.int32) for chunk in chunks]).sum(0, dtype=torch.int32).to(torch.float32)


def _packed(qdata: torch.Tensor) -> torch.Tensor:
    key, version = id(qdata), _version(qdata)
    found = _PACKED.get(key)
    if found is not None and found[0]() is qdata and found[1] == version:
        return found[2]
    packed = torch.ops.onednn.qlinear_prepack(qdata, None)
    if found is None or found[0]() is not qdata:
        weakref.finalize(qdata, _PACKED.pop, key, None)
    _PACKED[key] = (weakref.ref(qdata), version, packed)
    return packed


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's count of in-place changes; None for a tensor made under inference mode, which keeps none (and
    cannot be changed in place outside it)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


@functools.lru_cache(maxsize=64)
def _unit(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(rows), torch.zeros(rows, dtype=torch.long)


def _qlinear(q_unsigned: torch.Tensor, packed: torch.Tensor, rows: int) -> torch.Tensor:
    scales, zero_points = _unit(rows)
    return _OPS.qlinear_pointwise(
        q_unsigned, 1.0, 128, packed, scales, zero_points, None, 1.0, 0, torch.float32, "none", [], ""
    )
