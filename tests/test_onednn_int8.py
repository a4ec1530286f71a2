"""Dynamic int8's products through oneDNN's quantized linear (modeling/onednn_int8.py): the fp32 sums equal
`torch._int_mm`'s on every shape, the worst case included, where the kernel is exact; a kernel that is not (16-bit
pairs that saturate, on CPUs without VNNI or AMX) is found out and left off; a dynamic int8 model takes it."""

import pytest
import torch
import transformers

from fivefold.modeling import onednn_int8
from fivefold.modeling.onednn_int8 import exact_int8_sums, qlinear_exact, unsigned
from fivefold.modeling.quantization import quantized_modules

needs_exact_kernel = pytest.mark.skipif(
    not qlinear_exact(), reason="oneDNN's u8 x s8 kernel is not exact on this CPU (no VNNI or AMX), so it stays off"
)


@needs_exact_kernel
@pytest.mark.parametrize(("rows", "width", "outputs"), [(1, 16, 8), (7, 33, 5), (3, 1, 1), (64, 384, 96), (0, 16, 8)])
def test_sums_equal_int_mm(rows, width, outputs):
    gen = torch.Generator().manual_seed(rows + width)
    q = torch.randint(-128, 128, (rows, width), dtype=torch.int8, generator=gen)
    weight = torch.randint(-128, 128, (outputs, width), dtype=torch.int8, generator=gen)
    q[:, :2], weight[: outputs // 2, :2] = 127, -128  # the extremes: 255 x -128 twice, a pair past 16 bits
    expected = torch._int_mm(q, weight.t()).to(torch.float32) if rows else torch.zeros(0, outputs)
    assert torch.equal(exact_int8_sums(unsigned(q), weight), expected)


def test_a_kernel_that_saturates_is_left_off(monkeypatch):
    real = onednn_int8._qlinear

    def saturating(q_unsigned, packed, rows):  # what 16-bit pair sums would give on the worst case
        return real(q_unsigned, packed, rows).clamp(-(2**15), 2**15 - 1)

    monkeypatch.setattr(onednn_int8, "_qlinear", saturating)
    onednn_int8.qlinear_exact.cache_clear()
    try:
        assert not onednn_int8.qlinear_exact()
        q, weight = torch.zeros(2, 16, dtype=torch.int8), torch.ones(4, 16, dtype=torch.int8)
        assert exact_int8_sums(unsigned(q), weight) is None
    finally:
        onednn_int8.qlinear_exact.cache_clear()


def _dynamic_int8_bert(converted) -> tuple[torch.nn.Module, torch.Tensor]:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    _, folder = converted("bert", "BertModel")
    config = transformers.TorchAoConfig(Int8DynamicActivationInt8WeightConfig())
    model = transformers.AutoModel.from_pretrained(folder, quantization_config=config).eval()
    return model, torch.randint(5, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))


@needs_exact_kernel
def test_a_dynamic_int8_model_takes_the_kernel(converted, monkeypatch):
    model, ids = _dynamic_int8_bert(converted)
    assert qlinear_exact()  # checked before counting (its check runs the kernel once)
    calls, real = [], onednn_int8._qlinear
    monkeypatch.setattr(onednn_int8, "_qlinear", lambda *args: calls.append(1) or real(*args))
    with torch.no_grad():
        got = model(ids).last_hidden_state
        monkeypatch.setattr(onednn_int8, "ON", False)
        expected = model(ids).last_hidden_state  # through torch._int_mm
    assert len(calls) == len(quantized_modules(model)) and torch.equal(got, expected)  # every linear, the pooler's too


@needs_exact_kernel
def test_a_weight_changed_in_place_is_packed_again(converted, monkeypatch):
    """`load_state_dict` copies new values into a quantized weight's int8 data: the packed copy follows."""
    model, ids = _dynamic_int8_bert(converted)
    with torch.no_grad():
        before = model(ids).last_hidden_state  # packs every weight
        for module in map(model.get_submodule, quantized_modules(model)):
            module.weight.qdata.copy_(module.weight.qdata.flip(-1))
        got = model(ids).last_hidden_state
        monkeypatch.setattr(onednn_int8, "ON", False)
        expected = model(ids).last_hidden_state
    assert not torch.equal(got, before) and torch.equal(got, expected)


@pytest.mark.parametrize(
    ("rows", "width", "outputs"), [(1, 16, 8), (7, 33, 5), (64, 384, 96), (3, 1024, 4), (2, 4096, 3)]
)
def test_sums_in_fp32_equal_int_mm_where_the_int8_kernels_saturate(monkeypatch, rows, width, outputs):
    """Where oneDNN's int8 kernels saturate, the sums are an fp32 product of the integer values (torch's `_int_mm` is
    a slow loop there): `_int_mm`'s sums converted to fp32, bit for bit, the extremes included (-128 x -128 over
    1,024 channels is 2^24; 4,096 channels go 1,024 at a time). Elsewhere it leaves the product to the others."""
    gen = torch.Generator().manual_seed(rows + width)
    q = torch.randint(-128, 128, (rows, width), dtype=torch.int8, generator=gen)
    weight = torch.randint(-128, 128, (outputs, width), dtype=torch.int8, generator=gen)
    q[0], weight[0] = -128, -128
    q[-1, 1::2], weight[-1, ::2] = 127, 127  # partial sums that rise past 2^24 and fall back
    expected = torch._int_mm(q, weight.t()).to(torch.float32)
    monkeypatch.setattr(onednn_int8, "qlinear_exact", lambda: True)
    assert onednn_int8.sums_in_fp32(q, weight) is None
    monkeypatch.setattr(onednn_int8, "qlinear_exact", lambda: False)
    sums = onednn_int8.sums_in_fp32(q, weight)
    assert sums.dtype == torch.float32 and torch.equal(sums, expected)
