"""torchao int8 under torch.compile. Weight-only: fivefold's linears hand dynamo the int8 product itself
(`_weight_int8pack_mm`), which inductor lowers to its own int8 GEMM under freezing and max-autotune, in one graph
with the same results as eager. Dynamic (int8 activations too): torchao's own product is traced, and inductor keeps
it in int8 (`torch._int_mm`) with the quantization around it fused; on a CPU whose oneDNN int8 kernels saturate,
fivefold's exact fp32 product of the integer values instead. A mixture's int8 experts run behind `torch.cond`
where their weights enter the graph as plain tensors; there the weights are operands, not constants, and an expert's
int8 product is written so that inductor makes it fast without a GEMM of its own."""

import operator

import pytest
import torch
import transformers

from fivefold.modeling import int8, onednn_int8
from fivefold.modeling.quantization import quantized_modules

pytest.importorskip("torchao")


@pytest.fixture
def int8_gpt2(converted, monkeypatch):
    """A tiny fivefold GPT-2 under int8 weight-only with its table and tied head, the int8 kernel on (forced on
    where torch runs it as a scalar loop: its results are the same), and a prompt."""
    from torchao.quantization import Int8WeightOnlyConfig

    monkeypatch.setattr(int8, "INT8PACK_ON", True)
    _, folder = converted("gpt2", "GPT2LMHeadModel")
    config = transformers.TorchAoConfig(Int8WeightOnlyConfig(), include_input_output_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=config).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    return model, ids


def _products(graph: torch.fx.GraphModule) -> int:
    op = torch.ops.aten._weight_int8pack_mm
    return sum(node.target in (op, op.default) for node in graph.graph.nodes)


def _traced(model, ids, **inputs) -> tuple[list[torch.fx.GraphModule], torch.Tensor, torch.Tensor]:
    """Dynamo's graphs of the model's forward (run as traced, no compiler), its logits so and in eager. Traced
    first: nothing found for a weight in eager is there to help the trace."""
    graphs = []

    def recording(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=recording, fullgraph=True)(ids, **inputs).logits
        eager = model(ids, **inputs).logits
    return graphs, compiled, eager


def test_compiled_int8_linears_are_the_int8_product_in_one_graph(int8_gpt2):
    model, ids = int8_gpt2
    graphs, compiled, eager = _traced(model, ids)
    assert len(graphs) == 1
    linears = [model.get_submodule(name) for name in quantized_modules(model)]
    linears = [m for m in linears if isinstance(m, torch.nn.Linear)]  # the table is looked up, not multiplied
    # The kernel reads past a row whose width is no multiple of 16 (the tiny model's 37-wide down projections):
    # those keep torchao's op, compiled as in eager.
    taken = [m for m in linears if m.in_features % 16 == 0]
    assert 0 < len(taken) < len(linears)
    assert _products(graphs[0]) == len(taken)
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)


def test_weights_the_kernel_must_not_take_keep_torchaos_op_when_compiled(int8_gpt2, monkeypatch):
    """Found on the real weight while tracing: a weight the eager path refuses (here: every weight, the kernel off)
    is traced as torchao's own dequantizing product, as before."""
    model, ids = int8_gpt2
    monkeypatch.setattr(int8, "INT8PACK_ON", False)
    graphs, compiled, eager = _traced(model, ids)
    assert _products(graphs[0]) == 0
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)


def test_inductor_freezes_the_int8_weights_and_equals_eager(int8_gpt2, monkeypatch):
    """Inductor under freezing (weights as constants of the graph, as its int8 GEMM template needs them): the
    compiled model's logits equal eager's within bf16's rounding of the sums, and greedy tokens agree."""
    model, ids = int8_gpt2
    monkeypatch.setattr(torch._inductor.config, "freezing", True)
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)(ids).logits
        eager = model(ids).logits
    torch.testing.assert_close(compiled, eager, atol=1e-3, rtol=1e-3)
    assert torch.equal(compiled.argmax(-1), eager.argmax(-1))


@pytest.mark.parametrize("saturating", [False, True], ids=["this-cpus-onednn", "onednn-saturating"])
def test_compiled_dynamic_int8_multiplies_in_int8_as_close_to_fp32_as_eager(converted, monkeypatch, saturating):
    """A BERT under torchao's dynamic int8, compiled with frozen weights as benchmarks/quantized.py compiles
    MiniLM: every quantized linear is an int8 product in inductor's code (no weight folded back to fp32), and the
    hidden states are as close to the fp32 model's as eager int8's. Not equal to eager's: each layer alone
    compiles to eager's results, the whole model does not (a few activations rounded to the neighbouring int8
    step, which the tiny model's next layer carries on: mean differences about 70% of int8's own error).

    Where oneDNN's int8 kernels saturate (no VNNI or AMX), inductor lowered torchao's product to oneDNN's all the
    same: 12x eager's error on an AVX2-only Zen 3. There fivefold traces an fp32 product of the integer values
    (exact), which freezing turns into fp32 constants holding the int8 values: no int8 kernel at all, on any CPU
    when the check says so."""
    from torch._inductor.utils import run_and_get_code
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    import fivefold

    if saturating:
        if not onednn_int8.qlinear_exact():
            pytest.skip("this CPU's oneDNN saturates: the other case runs this very path")
        monkeypatch.setattr(onednn_int8, "qlinear_exact", lambda: False)

    _, folder = converted("bert", "BertModel")
    config = transformers.TorchAoConfig(Int8DynamicActivationInt8WeightConfig())
    model = transformers.AutoModel.from_pretrained(folder, quantization_config=config).eval()
    linears = [m for m in map(model.get_submodule, quantized_modules(model)) if isinstance(m, torch.nn.Linear)]
    ids = torch.randint(5, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids).index_fill_(1, torch.tensor([7, 8]), 0)  # one padded tail, as a batch has
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        torch._dynamo.reset()
        forward = torch.compile(model, options={"guard_filter_fn": fivefold.frozen_weight_guards})
        compiled, code = run_and_get_code(lambda: forward(ids, attention_mask=mask).last_hidden_state)
        eager = model(ids, attention_mask=mask).last_hidden_state
        full = transformers.AutoModel.from_pretrained(folder).eval()(ids, attention_mask=mask).last_hidden_state
    # Inductor multiplies in int8 through `_int_mm`, or through oneDNN's quantized linear, which its x86 lowering
    # fuses the activations' quantization into; where that kernel saturates, in fp32 (MKL's or aten's GEMM).
    int8_kernels, fp32_kernels = (
        ("extern_kernels._int_mm(", "onednn.qlinear_pointwise"),
        ("mkl_linear", "extern_kernels.mm("),
    )
    calls = {kernel: "\n".join(code).count(kernel) for kernel in int8_kernels + fp32_kernels}
    if saturating or not onednn_int8.qlinear_exact():
        assert linears and not any(calls[k] for k in int8_kernels)
        assert sum(calls[k] for k in fp32_kernels) >= len(linears)
    else:
        assert linears and sum(calls[k] for k in int8_kernels) >= len(linears)
    real = mask.bool()
    error, eager_error = ((t - full)[real].abs().mean() for t in (compiled, eager))
    assert 0 < error <= 1.5 * eager_error


@pytest.mark.parametrize(("width", "cond"), [(48, True), (40, False)])
def test_compiled_int8_mixture_skips_unchosen_experts_where_their_weights_trace_as_plain_tensors(
    converted, monkeypatch, width, cond
):
    """A tiny Mixtral under int8 weight-only, compiled without gradients through AOTAutograd: where every expert's
    weights enter the graph as their int8 data and scales (widths multiple of 16), each expert runs behind
    `torch.cond`; where a weight stays torchao's tensor subclass (a 40-wide down projection), which AOTAutograd
    refuses as an operand of `torch.cond`, the layer runs every expert instead. Both compile and equal eager."""
    from torchao.quantization import Int8WeightOnlyConfig

    monkeypatch.setattr(int8, "INT8PACK_ON", True)
    _, folder = converted("mixtral", "MixtralForCausalLM", intermediate_size=width, num_hidden_layers=1)
    config = transformers.TorchAoConfig(Int8WeightOnlyConfig())
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=config).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    graphs = []

    def recording(graph, example_inputs):
        graphs.append(graph)
        return torch._dynamo.backends.registry.lookup_backend("aot_eager")(graph, example_inputs)

    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=recording, fullgraph=True)(ids, attention_mask=mask, use_cache=False)
        eager = model(ids, attention_mask=mask, use_cache=False).logits
    conds = sum(node.target is torch.ops.higher_order.cond for node in graphs[0].graph.nodes)
    experts = model.config.num_hidden_layers * model.config.num_local_experts
    assert conds == (experts if cond else 0)
    torch.testing.assert_close(compiled.logits, eager, atol=1e-5, rtol=1e-5)


# Without the rewrite one case: the kernel at one row, where the rewrite would make a reduction.
@pytest.mark.parametrize(("tokens", "rewritten"), [(1, True), (5, True), (9, True), (1, False)])
def test_int8_experts_behind_cond_multiply_as_a_reduction_or_a_bf16_product(converted, monkeypatch, tokens, rewritten):
    """Inside `torch.cond` an expert's int8 weights are operands, not constants, and inductor has no int8 GEMM of
    its own for them: at one row the experts' products trace as a reduction over the channels, from 8 rows as a bf16
    GEMM, in between as `_weight_int8pack_mm` still (which the attention's constant weights keep throughout); the
    logits stay eager's. On an AVX2-only CPU (`REWRITTEN` off) the kernel is the faster throughout, and stays."""
    from torchao.quantization import Int8WeightOnlyConfig

    from fivefold.modeling import operand_weights

    monkeypatch.setattr(int8, "INT8PACK_ON", True)
    monkeypatch.setattr(operand_weights, "REWRITTEN", rewritten)
    _, folder = converted("mixtral", "MixtralForCausalLM", intermediate_size=48, num_hidden_layers=1)
    config = transformers.TorchAoConfig(Int8WeightOnlyConfig())
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=config).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    graphs, compiled, eager = _traced(model, ids, attention_mask=torch.ones_like(ids), use_cache=False)
    branches = [m for name, m in graphs[0].named_modules() if name.startswith("cond_true")]
    assert len(branches) == model.config.num_hidden_layers * model.config.num_local_experts
    assert sum(_products(branch) for branch in branches) == (3 * len(branches) if tokens == 5 or not rewritten else 0)
    written = {1: ("sum",), 5: (), 9: (operator.matmul, "matmul", "__matmul__")}[tokens] if rewritten else ()
    assert all(any(node.target in written for node in branch.graph.nodes) for branch in branches) == bool(written)
    assert _products(graphs[0]) == 4 * model.config.num_hidden_layers  # q, k, v, o
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 8])
def test_operand_int8_product_equals_the_int8_kernel(rows, monkeypatch):
    """The reduction and the bf16 GEMM give `_weight_int8pack_mm`'s products with unit scales, to bf16's rounding."""
    from fivefold.modeling import operand_weights
    from fivefold.modeling.operand_weights import operand_int8_product

    monkeypatch.setattr(operand_weights, "REWRITTEN", True)

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 64, generator=generator).to(torch.bfloat16)
    qdata = torch.randint(-127, 128, (32, 64), dtype=torch.int8, generator=generator)
    expected = torch.ops.aten._weight_int8pack_mm(x, qdata, torch.ones(32, dtype=torch.bfloat16))
    product = operand_int8_product(x, qdata)
    assert product.dtype == torch.bfloat16 and product.shape == (rows, 32)
    torch.testing.assert_close(product.float(), expected.float(), rtol=2**-7, atol=0)  # one bf16 step
