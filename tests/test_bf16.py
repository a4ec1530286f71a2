"""Half precision on CPU: bf16 (and fp16 where the CPU has it) linears through oneDNN, activations fused into the
matmul as post-ops, and whole models in bf16 no less exact than stock in bf16, both against stock in fp32."""

import pytest
import torch
import transformers
from torch.nn import functional as F
from transformers.activations import ACT2FN

from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.modeling.linear import ONEDNN_AVAILABLE, ONEDNN_DTYPES, Linear, linear_then_activation

HALF = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in (torch.bfloat16, torch.float16)]


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_takes_onednn_where_the_cpu_supports_it(onednn_calls, dtype):
    torch.manual_seed(0)
    layer = Linear(64, 48).to(dtype)
    x = torch.randn(5, 64, dtype=dtype)
    with torch.no_grad():
        got, expected = layer(x), F.linear(x.float(), layer.weight.float(), layer.bias.float())
    assert got.dtype == dtype
    assert len(onednn_calls) == (dtype in ONEDNN_DTYPES)
    assert (got.float() - expected).abs().max() <= 2 * torch.finfo(dtype).eps * expected.abs().max()


@pytest.mark.skipif(not ONEDNN_AVAILABLE, reason="this torch build has no oneDNN")
@pytest.mark.parametrize("name", ["gelu", "gelu_new", "gelu_pytorch_tanh", "relu"])
def test_fused_activation_equals_the_activation_after_the_matmul(onednn_calls, name):
    torch.manual_seed(0)
    layer, act = Linear(32, 64), ACT2FN[name]
    x = torch.randn(3, 7, 32) * 3
    with torch.no_grad():
        got = linear_then_activation(layer, act, x)
        expected = act(F.linear(x, layer.weight, layer.bias))
    assert len(onednn_calls) == 1
    assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("hooked", ["layer", "activation"])
def test_a_module_under_a_hook_is_not_fused(onednn_calls, hooked):
    """A forward hook (PEFT, accelerate, a user's activation statistics) must see its module run: no fusion around
    the layer or the activation, and no in-place activation in its stead."""
    layer, act = Linear(32, 64), ACT2FN["gelu"]
    seen = []
    {"layer": layer, "activation": act}[hooked].register_forward_hook(lambda m, args, out: seen.append(out.shape))
    with torch.no_grad():
        linear_then_activation(layer, act, torch.randn(4, 32))
    assert seen == [(4, 64)]


@pytest.mark.parametrize("name", ["gelu", "gelu_pytorch_tanh", "relu", "gelu_new", "gelu_python"])
def test_an_unfused_activation_overwrites_the_layers_own_output(name):
    """Where oneDNN does not take the layer (here: too small for it), an activation whose forward is one aten op
    runs in place on the layer's fresh output outside autograd; a Python-formula activation runs its own forward.
    Either way the values are exactly `activation(layer(x))`'s, x is untouched, and under autograd gradients flow
    as through the plain modules."""
    torch.manual_seed(0)
    layer, act = Linear(8, 16), ACT2FN[name]
    x = torch.randn(3, 8) * 3
    before = x.clone()
    with torch.no_grad():
        expected = act(F.linear(x, layer.weight, layer.bias))
        got = linear_then_activation(layer, act, x)
    assert torch.equal(got, expected) and torch.equal(x, before)
    x.requires_grad_(True)
    linear_then_activation(layer, act, x).sum().backward()
    want = torch.autograd.grad(act(F.linear(x, layer.weight, layer.bias)).sum(), x)[0]
    torch.testing.assert_close(x.grad, want)


def model_error(model, reference: torch.Tensor, inputs: dict, compared: torch.Tensor) -> float:
    with torch.no_grad():
        out = model(**inputs)
    got = (out.logits if "logits" in out else out.last_hidden_state).float()
    return (got - reference)[compared].abs().max().item()


@pytest.mark.skipif(torch.bfloat16 not in ONEDNN_DTYPES, reason="this CPU has no oneDNN bf16 matmul")
@pytest.mark.parametrize(
    ("model_type", "auto_name"), [("bert", "AutoModel"), ("gpt2", "AutoModelForCausalLM"), ("vit", "AutoModel")]
)
def test_bf16_model_no_less_exact_than_stock_bf16(converted, onednn_calls, model_type, auto_name):
    """Every linear forced through oneDNN (the tiny weights are under its size thresholds); the error of each bf16
    model is measured against stock fp32 on the real tokens of the ragged sample batch."""
    (arch,) = [a for a in ARCHITECTURES if a.stock_model_type == model_type]
    cls = arch.models[auto_name]
    name = stock_class_name(cls)
    src, dst = converted(model_type, name)
    stock = getattr(transformers, name).from_pretrained(src, attn_implementation="sdpa").eval()
    inputs = arch.sample_inputs(stock.config, name, 0)
    mask = inputs.get("attention_mask")
    with torch.no_grad():
        out = stock(**inputs)
    reference = out.logits if "logits" in out else out.last_hidden_state
    compared = mask.bool() if mask is not None else torch.ones(reference.shape[:2], dtype=torch.bool)
    stock_error = model_error(stock.to(torch.bfloat16), reference, inputs, compared)
    ours = cls.from_pretrained(dst, attn_implementation="sdpa", dtype=torch.bfloat16).eval()
    if "pixel_values" in inputs:
        inputs = {"pixel_values": inputs["pixel_values"].bfloat16()}
    our_error = model_error(ours, reference, inputs, compared)
    assert onednn_calls
    assert 0 < stock_error and our_error <= 1.25 * stock_error, (our_error, stock_error)
