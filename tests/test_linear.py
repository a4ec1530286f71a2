"""The Linear every model uses: oneDNN's matmul in CPU inference, F.linear wherever autograd or the op can't follow."""

import pytest
import torch
import transformers
from torch.nn import functional as F

from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.verify import compare
from fivefold.modeling import linear as linear_module
from fivefold.modeling.linear import ONEDNN_AVAILABLE, ONEDNN_DTYPES, Linear, linear, use_torch_linears, uses_onednn

needs_onednn = pytest.mark.skipif(not ONEDNN_AVAILABLE, reason="this torch build has no oneDNN")


@needs_onednn
@pytest.mark.parametrize(
    "x_shape, out_features, bias",
    [
        ((1, 768), 3072, True),
        ((4, 1, 512), 2048, False),
        ((3, 7, 64), 48, True),
        ((2, 2, 3, 64), 8, True),
        ((0, 64), 32, True),
    ],
)
def test_onednn_path_equals_f_linear(onednn_calls, x_shape, out_features, bias):
    torch.manual_seed(0)
    layer = Linear(x_shape[-1], out_features, bias=bias)
    x = torch.randn(x_shape)
    with torch.no_grad():
        got = layer(x)
        expected = F.linear(x, layer.weight, layer.bias)
    assert len(onednn_calls) == 1
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_non_contiguous_input(onednn_calls):
    torch.manual_seed(0)
    layer = Linear(64, 96)
    x = torch.randn(5, 3, 64).transpose(0, 1)
    with torch.no_grad():
        assert torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert onednn_calls


def test_training_goes_through_autograd_with_the_same_gradients(onednn_calls):
    """The oneDNN op has no backward: a call that autograd records must take F.linear."""
    torch.manual_seed(0)
    layer = Linear(32, 16)
    reference = torch.nn.Linear(32, 16)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(4, 32, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    layer(x).square().sum().backward()
    reference(x_ref).square().sum().backward()
    assert onednn_calls == []
    assert torch.equal(x.grad, x_ref.grad)
    assert torch.equal(layer.weight.grad, reference.weight.grad)
    assert torch.equal(layer.bias.grad, reference.bias.grad)


def test_frozen_weights_and_an_input_needing_gradient_keep_the_graph(onednn_calls):
    layer = Linear(32, 16).requires_grad_(False)
    x = torch.randn(4, 32, requires_grad=True)
    layer(x).sum().backward()
    assert onednn_calls == []
    assert torch.allclose(x.grad, layer.weight.sum(0).expand(4, 32))


@needs_onednn
def test_frozen_weights_and_a_plain_input_take_onednn(onednn_calls):
    """A frozen layer fed by no trainable input (the first base layers under LoRA) needs no graph."""
    layer = Linear(32, 16).requires_grad_(False)
    out = layer(torch.randn(4, 32))
    assert len(onednn_calls) == 1
    assert not out.requires_grad


@pytest.mark.filterwarnings("ignore:TF32 acceleration")
def test_cases_the_op_does_not_cover_take_f_linear(onednn_calls):
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        for dtype in {torch.bfloat16, torch.float16} - ONEDNN_DTYPES:  # half precision this CPU lacks
            assert Linear(32, 16).to(dtype)(x.to(dtype)).dtype == dtype
        meta = Linear(32, 16, device="meta")
        assert meta(x.to("meta")).shape == (2, 3, 16)
        assert Linear(32, 16)(x[0, 0]).shape == (16,)  # a 1-D input
        with torch.backends.mkldnn.flags(enabled=False):
            Linear(32, 16)(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert Linear(32, 16)(x).dtype == torch.bfloat16  # as nn.Linear under autocast
    assert onednn_calls == []


def test_small_products_stay_on_f_linear():
    """oneDNN's cost per call only pays off from ONEDNN_MIN_WORK multiply-adds or ONEDNN_MIN_WEIGHT weights."""
    weight = torch.randn(16, 32)
    with torch.no_grad():
        assert not uses_onednn(torch.randn(2, 32), weight, None)
        assert uses_onednn(torch.randn(4096, 32), weight, None) == (torch.float32 in ONEDNN_DTYPES)
        assert uses_onednn(torch.randn(1, 256), torch.randn(256, 256), None) == (torch.float32 in ONEDNN_DTYPES)
    assert linear(torch.randn(2, 32), weight).shape == (2, 16)


@pytest.mark.parametrize(
    ("vendor", "mkl", "float32_on_onednn"),
    [("GenuineIntel", True, False), ("AuthenticAMD", True, True), ("GenuineIntel", False, True), ("", True, True)],
)
def test_float32_stays_on_aten_where_it_is_mkl_on_intel(monkeypatch, vendor, mkl, float32_on_onednn):
    """MKL's tuned fp32 GEMM on Intel is as fast as oneDNN's; on AMD (and where the vendor is unknown) oneDNN's wins."""
    monkeypatch.setattr(linear_module, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
    assert linear_module.aten_float32_is_mkl_on_intel() != float32_on_onednn


def test_the_cpu_vendor_is_read_from_linux():
    vendor = linear_module.cpu_vendor()
    with open("/proc/cpuinfo") as cpuinfo:
        assert vendor and vendor in cpuinfo.read()
    assert (torch.float32 in ONEDNN_DTYPES) == (ONEDNN_AVAILABLE and not linear_module.aten_float32_is_mkl_on_intel())


def _every_model():
    for arch in ARCHITECTURES:
        for cls in arch.models.values():
            yield pytest.param(arch, stock_class_name(cls), id=stock_class_name(cls))


@needs_onednn
@pytest.mark.parametrize("arch, stock_name", list(_every_model()))
def test_every_model_matches_stock_with_every_linear_through_onednn(converted, onednn_calls, arch, stock_name):
    """The tiny test models are below the size threshold: force the oneDNN path everywhere and compare every
    floating output (logits, hidden states, ...) with stock on the architecture's padded sample batch."""
    src, dst = converted(arch.stock_model_type, stock_name)
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    ours = next(cls for cls in arch.models.values() if stock_class_name(cls) == stock_name).from_pretrained(dst)
    diffs = compare(stock, ours.eval(), arch.sample_inputs(stock.config, stock_name, 0))
    assert onednn_calls, "no linear took the oneDNN path"
    assert max(diffs.values()) <= 1e-4, diffs


def test_under_torch_compile_the_graph_holds_f_linear(onednn_calls):
    """Inductor picks its own kernel for a linear and cannot lower the oneDNN op on an unpacked weight."""
    graphs = []

    def record(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    layer = Linear(64, 96).eval()
    x = torch.randn(4, 64)
    with torch.no_grad():
        eager = layer(x)
        compiled = torch.compile(layer, backend=record, fullgraph=True)(x)
    assert graphs and "mkldnn" not in str(graphs[0].graph)
    assert "linear" in str(graphs[0].graph)
    assert torch.allclose(compiled, eager, rtol=1e-5, atol=1e-5)


def _pair(in_features: int = 16, out_features: int = 8) -> tuple[Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    layer, reference = Linear(in_features, out_features), torch.nn.Linear(in_features, out_features)
    reference.load_state_dict(layer.state_dict())
    return layer, reference


def test_torch_func_transforms_match_nn_linear(onednn_calls):
    """grad, vmap, jvp and jacfwd see the same function as nn.Linear's, also on frozen layers under no_grad."""
    from torch.func import functional_call, grad, jacfwd, jvp, vmap

    layer, reference = _pair()
    x, tangent = torch.randn(4, 16), torch.randn(4, 16)
    params = {name: p.detach() for name, p in layer.named_parameters()}

    def loss(params, module):
        return functional_call(module, params, (x,)).square().sum()

    ours, theirs = grad(loss)(params, layer), grad(loss)(params, reference)
    assert all(torch.allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-6) for name in params)
    layer.requires_grad_(False)
    reference.requires_grad_(False)
    with torch.no_grad():
        mapped = vmap(lambda row: layer(row[None]))(x)
        assert torch.allclose(mapped[:, 0], reference(x), rtol=1e-5, atol=1e-6)
        _, ours = jvp(layer, (x,), (tangent,))
        _, theirs = jvp(reference, (x,), (tangent,))
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6) and theirs.abs().max() > 0
        assert torch.allclose(jacfwd(layer)(x[0]), layer.weight)
    assert onednn_calls == []


def test_forward_mode_ad_keeps_the_tangent(onednn_calls):
    from torch.autograd import forward_ad

    layer, reference = _pair()
    layer.requires_grad_(False)
    x, tangent = torch.randn(4, 16), torch.randn(4, 16)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, tangent)
        got = forward_ad.unpack_dual(layer(dual)).tangent
    assert got is not None and torch.allclose(got, tangent @ reference.weight.T, rtol=1e-5, atol=1e-6)
    assert onednn_calls == []


@needs_onednn
def test_a_bias_the_op_cannot_read_takes_f_linear(onednn_calls):
    """The op reads the bias as one dense vector: a strided or expanded bias would be misread."""
    torch.manual_seed(0)
    x, weight = torch.randn(4, 64), torch.randn(32, 64)
    with torch.no_grad():
        for bias in (torch.randn(64)[::2], torch.randn(1).expand(32)):
            assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))
        assert onednn_calls == []
        linear(x, weight, torch.randn(40)[8:])  # an offset into a dense vector is fine
    assert len(onednn_calls) == 1


def test_weights_elsewhere_fail_as_f_linear_does(onednn_calls):
    layer = Linear(64, 32, device="meta")
    with torch.no_grad(), pytest.raises(RuntimeError, match="meta"):
        layer(torch.randn(4, 64))
    assert onednn_calls == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tracers_and_flop_counters_see_an_aten_linear(onednn_calls):
    from torch.utils.flop_counter import FlopCounterMode

    layer, reference = _pair(64, 32)
    layer.requires_grad_(False)
    x = torch.randn(4, 64)
    with torch.no_grad():
        traced = torch.jit.trace(layer, x, check_trace=False)
        graph = torch.fx.symbolic_trace(layer)
        with FlopCounterMode(display=False) as counter:
            layer(x)
        assert onednn_calls == []
        for code in (str(traced.graph), graph.code):
            assert "linear" in code and "mkldnn" not in code
        assert torch.allclose(traced(x), reference(x), rtol=1e-5, atol=1e-6)
        assert torch.allclose(graph(x), reference(x), rtol=1e-5, atol=1e-6)
    assert counter.get_total_flops() == 2 * 4 * 64 * 32


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_use_torch_linears_for_tools_that_match_exact_types():
    from fivefold.configuration.gpt2 import FivefoldGPT2Config
    from fivefold.modeling.gpt2 import FivefoldGPT2LMHeadModel

    config = FivefoldGPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    model = FivefoldGPT2LMHeadModel(config).eval()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        before = model(ids).logits
        assert use_torch_linears(model) is model
        assert not any(type(m) is Linear for m in model.modules())
        assert type(model.model.layers[0].attn.q_proj) is torch.nn.Linear
        assert torch.equal(model(ids).logits, before)
        quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    assert isinstance(quantized.model.layers[0].attn.q_proj, torch.ao.nn.quantized.dynamic.Linear)
