"""torch.compile: every architecture's forward in one graph (`fullgraph=True`) equal to eager, decoding steps over a
static cache, dynamic shapes without recompiling; the input checks run in eager and are skipped only while tracing.

Most tests trace with `aot_eager` (dynamo and AOTAutograd: a graph break or a data-dependent guard fails there as it
does under inductor, without inductor's C++ build, ~10 s a model on 2 cores); inductor runs end to end in two:
one test against eager, one with frozen weights and `fivefold.frozen_weight_guards`."""

import pytest
import torch
from transformers import EncoderDecoderCache, StaticCache
from transformers.cache_utils import StaticSlidingWindowLayer

import fivefold
from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.modeling.embeddings import check_token_ids
from fivefold.modeling.tracing import tracing

TOL = 1e-4
CHEAP = "aot_eager"
DECODERS = [
    pytest.param(arch, id=arch.stock_model_type) for arch in ARCHITECTURES if "AutoModelForCausalLM" in arch.models
]


MIXTURES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every architecture runs the one shared block, so dynamo's recompile limit (per code object) would count
    all of the table's graphs together: each test starts from dynamo's empty caches."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def load(converted, arch, auto_name: str = "AutoModel", **overrides):
    cls = arch.models[auto_name]
    name = stock_class_name(cls)
    _, dst = converted(arch.stock_model_type, name)
    model = cls.from_pretrained(dst, attn_implementation="sdpa", **overrides).eval()
    return model, arch.sample_inputs(model.config, name, 0)


def first_output(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, use_cache=False, return_dict=False)[0]


@pytest.mark.slow  # dynamo and inductor: seconds a model
@pytest.mark.parametrize("arch", [pytest.param(a, id=a.stock_model_type) for a in ARCHITECTURES])
def test_forward_compiles_to_one_graph_equal_to_eager(converted, arch):
    model, inputs = load(converted, arch)
    if "attention_mask" in inputs and arch.stock_model_type != "t5":
        assert inputs["attention_mask"].min() == 0  # a ragged batch: eager unpads the encoders, the graph does not
    expected = first_output(model, inputs)
    got = first_output(torch.compile(model, fullgraph=True, backend=CHEAP), inputs)
    assert (got - expected).abs().max() <= TOL


@pytest.mark.slow  # dynamo and inductor: seconds a model
def test_inductor_matches_eager(converted):
    (arch,) = [a for a in ARCHITECTURES if a.stock_model_type == "bert"]
    model, inputs = load(converted, arch)
    expected = first_output(model, inputs)
    got = first_output(torch.compile(model, fullgraph=True), inputs)
    assert (got - expected).abs().max() <= TOL


# Mixtral's routed experts are Qwen2-MoE's without the shared one: Qwen2-MoE stands for both here (~30 s a mixture).
DYNAMIC = ("bert", "modernbert", "qwen2_moe", "gpt_oss")
# ModernBERT with a window of 8 positions on each side, which the lengths below straddle.
DYNAMIC_OVERRIDES = {"modernbert": {"local_attention": 16}}


@pytest.mark.parametrize(
    "arch", [pytest.param(a, id=a.stock_model_type) for a in ARCHITECTURES if a.stock_model_type in DYNAMIC]
)
@pytest.mark.slow  # dynamo and inductor: seconds a model
def test_dynamic_shapes_compile_once(converted, arch):
    """Lengths 7 to 12 through one graph with symbolic sizes, with a mask and without. A mixture's experts sit behind
    `torch.cond`, whose branches take the experts' numbers as operands: none may be read as a condition there (an
    unused dropout's probability was, until the experts held no dropout module). ModernBERT's window mask must not
    be skipped by length (a guard: lengths under the window compiled a second graph)."""
    model, inputs = load(converted, arch, **DYNAMIC_OVERRIDES.get(arch.stock_model_type, {}))
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=CHEAP)
    first_output(compiled, inputs)
    first_output(compiled, {k: v for k, v in inputs.items() if k != "attention_mask"})
    with torch._dynamo.config.patch(error_on_recompile=True):
        for length in (7, 9, 12):
            shorter = {k: v[:2, :length].contiguous() for k, v in inputs.items()}
            unmasked = {k: v for k, v in shorter.items() if k != "attention_mask"}
            for batch in (shorter, unmasked):
                assert (first_output(compiled, batch) - first_output(model, batch)).abs().max() <= TOL


# One row (generate's compiled path for one prompt) for a decoder of each kind of position, window, attention norm
# (per head: Qwen3; over the width: OLMoE) and mixture. Left out: Qwen2, Llama with biases and a window on its upper
# layers (windows by layer: gpt-oss's alternate), and Qwen3-MoE, Qwen3's norm before routed experts; both compile
# whole in test_forward_compiles_to_one_graph_equal_to_eager. A padded batch of two for a set of them.
ONE_ROW = ("gpt2", "llama", "mistral", "qwen3", "mixtral", "qwen2_moe", "olmoe", "gpt_oss")
STATIC_CASES = [pytest.param(a.values[0], 1, id=f"1-{a.id}") for a in DECODERS if a.id in ONE_ROW] + [
    pytest.param(a.values[0], 2, id=f"2-{a.id}") for a in DECODERS if a.id in ("gpt2", "mistral", *MIXTURES[:2])
]


@pytest.mark.slow  # dynamo and inductor: seconds a model
@pytest.mark.parametrize(("arch", "rows"), STATIC_CASES)
def test_decode_steps_over_a_static_cache_compile_once(converted, arch, rows):
    """Prefill in eager, then decoding steps (one token per row, the mask over every slot of the cache) through a
    compiled forward that compiles once, against the same steps in eager over a cache of their own. One row: the
    prefill and steps as generate() takes them for one prompt, position ids and no mask, compiled too (a compiled
    step with a cache reads no packing). Sliding windows: transformers' static window layers guard on whether the
    window is full, so the steps compile twice (stock's too) and are checked for equality only."""
    model, _ = load(converted, arch, "AutoModelForCausalLM")
    layers = StaticCache(config=model.config, max_cache_len=12).layers
    windowed = any(isinstance(layer, StaticSlidingWindowLayer) for layer in layers)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, model.config.vocab_size, (rows, 6), generator=gen)
    steps = torch.randint(5, model.config.vocab_size, (rows, 3), generator=gen)
    slots = 12
    compiled = torch.compile(model, fullgraph=True, backend=CHEAP)

    def decode(step) -> torch.Tensor:
        cache = StaticCache(config=model.config, max_cache_len=slots)
        logits = []
        with torch.no_grad():
            if rows > 1:
                model(input_ids=prompt, cache=cache, attention_mask=torch.ones_like(prompt), use_cache=True)
            else:  # as generate() runs a compiled prefill for one prompt: position ids, no mask
                positions = torch.arange(prompt.shape[1]).unsqueeze(0)
                logits.append(step(input_ids=prompt, cache=cache, position_ids=positions, use_cache=True).logits)
            for i in range(steps.shape[1]):
                with torch._dynamo.config.patch(error_on_recompile=i > 0 and not windowed):
                    out = step(
                        input_ids=steps[:, i : i + 1],
                        cache=cache,
                        position_ids=torch.tensor([[prompt.shape[1] + i]]),
                        attention_mask=torch.ones(rows, slots, dtype=torch.long) if rows > 1 else None,
                        use_cache=True,
                    )
                logits.append(out.logits)
        return torch.cat(logits, dim=1)

    assert (decode(compiled) - decode(model)).abs().max() <= TOL


@pytest.mark.slow  # dynamo and inductor: seconds a model
def test_t5_decode_steps_over_a_static_cache_compile_once(converted):
    """T5's decoder over a static self-attention cache: the relative bias and the mask cover every slot, the
    queries' positions come from the cache's counter (a tensor), so later steps reuse the first step's graph."""
    (arch,) = [a for a in ARCHITECTURES if a.stock_model_type == "t5"]
    model, inputs = load(converted, arch, "AutoModelForSeq2SeqLM")
    gen = torch.Generator().manual_seed(0)
    steps = torch.randint(5, model.config.vocab_size, (inputs["input_ids"].shape[0], 4), generator=gen)
    slots = 12
    compiled = torch.compile(model, fullgraph=True, backend=CHEAP)

    def decode(step) -> torch.Tensor:
        encoded = model.get_encoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        cache = EncoderDecoderCache(
            StaticCache(config=model.config, max_cache_len=slots),
            StaticCache(config=model.config, max_cache_len=inputs["input_ids"].shape[1]),
        )
        logits = []
        with torch.no_grad():
            for i in range(steps.shape[1]):
                with torch._dynamo.config.patch(error_on_recompile=i > 1):
                    out = (model if i == 0 else step)(  # the first step fills the cross-attention cache in eager
                        encoder_outputs=encoded,
                        attention_mask=inputs["attention_mask"],
                        decoder_input_ids=steps[:, i : i + 1],
                        decoder_attention_mask=torch.ones(steps.shape[0], slots, dtype=torch.long),
                        cache=cache,
                        use_cache=True,
                    )
                logits.append(out.logits)
        return torch.cat(logits, dim=1)

    assert (decode(compiled) - decode(model)).abs().max() <= TOL


def test_input_checks_run_in_eager_and_are_skipped_only_while_tracing():
    bad = torch.tensor([[1, 2, 500]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        check_token_ids(bad, 99)

    def checked(ids: torch.Tensor) -> tuple[torch.Tensor, bool]:
        check_token_ids(ids, 99)
        return ids + 1, tracing()

    out, traced = torch.compile(checked, fullgraph=True, backend=CHEAP)(bad)
    assert traced and out.tolist() == [[2, 3, 501]]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        checked(bad)  # the same function in eager, after compiling it


@pytest.mark.slow  # inductor: seconds a model
def test_frozen_weight_guards_keep_two_models_of_one_class_apart(converted):
    """Two GPT-2s with different weights, compiled with frozen weights in one process and sharing one forward code
    object: each answers with its own weights (the parameters' identities are still guarded), while most of
    dynamo's module guards are gone."""
    (arch,) = [a for a in ARCHITECTURES if a.stock_model_type == "gpt2"]
    (first, inputs), (second, _) = load(converted, arch), load(converted, arch)
    models = [first, second]
    with torch.no_grad():
        for weight in second.parameters():
            weight.mul_(1.5)
    expected = [first_output(model, inputs) for model in models]
    assert (expected[0] - expected[1]).abs().max() > 0.1
    decisions = []

    def recording(entries: list) -> list[bool]:
        decisions.append(fivefold.frozen_weight_guards(entries))
        return decisions[-1]

    for model in models:
        model.forward = torch.compile(model.forward, options={"guard_filter_fn": recording})
    with torch._inductor.config.patch(freezing=True):
        got = [first_output(model, inputs) for model in models]
    assert len(decisions) == 2  # a graph for each model
    for found, want in zip(got, expected, strict=True):
        assert (found - want).abs().max() <= TOL
    for kept in decisions:
        assert len(list(first.parameters())) <= sum(kept) < len(kept) / 2


class _BrokenLayer(torch.nn.Module):
    """A layer whose forward is a frame of its own (a graph break inside, as bitsandbytes' int8 linears make):
    every instance runs that one code, told apart by its attributes."""

    def __init__(self, index: int):
        super().__init__()
        self.layer_idx = index
        self.table = torch.full((2,), float(index))  # a plain tensor attribute (bitsandbytes' `state.CB`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x * 2 + self.layer_idx + self.table.sum()


def test_frozen_weight_guards_keep_instances_of_a_graph_broken_module_apart():
    model = torch.nn.Sequential(*(_BrokenLayer(i) for i in range(3)))
    x = torch.zeros(2)
    expected = model(x)
    model.forward = torch.compile(model.forward, options={"guard_filter_fn": fivefold.frozen_weight_guards})
    assert torch.equal(model(x), expected)


@pytest.mark.slow  # dynamo and AOTAutograd, forward and backward: seconds a model
@pytest.mark.parametrize("arch", [a for a in DECODERS if a.id in ("gpt2", "llama", "mistral", "qwen2_moe", "gpt_oss")])
def test_training_step_without_a_mask_compiles_to_one_graph(converted, arch):
    """A training forward as a pretraining loop or `DataCollatorWithFlattening` calls it: input ids and labels, no
    mask, no cache; a batch of rows, then documents packed in one row (position ids restarting). One graph each,
    loss and gradients equal to eager (which packs the documents; the graph leaves that to the mask functions)."""
    model, _ = load(converted, arch, "AutoModelForCausalLM")
    model.train()  # `use_cache` as the config has it (on): the forward makes a cache, which must not undo packing
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(5, model.config.vocab_size, (2, 7), generator=gen)
    packed = torch.randint(5, model.config.vocab_size, (1, 9), generator=gen)
    batches = [
        {"input_ids": rows, "labels": rows},
        {"input_ids": packed, "labels": packed, "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]])},
    ]
    compiled = torch.compile(model, fullgraph=True, backend=CHEAP)
    for batch in batches:
        results = []
        for forward in (model, compiled):
            model.zero_grad()
            torch.manual_seed(0)  # dropout, where a config has it
            loss = forward(**batch).loss
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        (want, want_grads), (got, got_grads) = results
        assert (got - want).abs() <= TOL
        assert len(got_grads) == len(want_grads) > 0
        assert max((g - w).abs().max() for g, w in zip(got_grads, want_grads, strict=True)) <= TOL


@pytest.mark.slow  # dynamo and AOTAutograd: seconds a model
@pytest.mark.parametrize("arch", [a for a in DECODERS if a.id in ("llama", *MIXTURES)])  # llama: no experts
def test_a_forward_that_makes_its_cache_compiles_to_one_graph(converted, arch):
    """`use_cache` on and no cache given, as `model(**batch)` runs by default: the forward makes a `DynamicCache`
    inside the graph and fills it layer by layer. One graph, logits equal to eager's, and the cache it returns
    continues decoding as eager's does. A mixture's experts then run without `torch.cond` (dynamo loses attribute
    stores on objects made in the trace once it has traced one, tracing.py); given a cache, they keep it."""
    model, _ = load(converted, arch, "AutoModelForCausalLM")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (2, 6), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    step = torch.randint(5, model.config.vocab_size, (2, 1), generator=gen)
    graphs = []

    def recording(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm

    def conds() -> int:
        return sum(n.target is torch.ops.higher_order.cond for g in graphs for n in g.graph.nodes)

    compiled = torch.compile(model, fullgraph=True, backend=recording)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, use_cache=True)
        got = compiled(input_ids=ids, attention_mask=mask, use_cache=True)
        assert (got.logits - want.logits).abs().max() <= TOL
        assert conds() == 0
        longer = torch.cat([mask, torch.ones_like(step)], dim=1)
        next_want = model(input_ids=step, attention_mask=longer, cache=want.past_key_values).logits
        next_got = model(input_ids=step, attention_mask=longer, cache=got.past_key_values).logits
        assert (next_got - next_want).abs().max() <= TOL
        given = StaticCache(config=model.config, max_cache_len=8)
        compiled(input_ids=ids, attention_mask=torch.ones_like(ids), cache=given, use_cache=True)
    if any(".experts." in name for name, _ in model.named_parameters()):
        assert conds() > 0


@pytest.mark.slow  # dynamo: a few seconds
def test_an_eager_call_after_a_compiled_mixture_returns_its_hidden_states(converted):
    """A compiled mixture's experts sit behind `torch.cond`, after which torch 2.13's dynamo drops attribute stores:
    transformers' output collector, reset at the end of the forward, stayed set after the compiled call, and later
    eager calls returned no hidden states. Each eager fivefold forward now resets it first (a stock model called
    next, before any fivefold one, still meets it set)."""
    (arch,) = [a.values[0] for a in DECODERS if a.id == "mixtral"]
    model, _ = load(converted, arch, "AutoModelForCausalLM")
    ids = torch.randint(5, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        assert len(model(ids, output_hidden_states=True, use_cache=False).hidden_states) == layers + 1
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        compiled(input_ids=ids, cache=StaticCache(config=model.config, max_cache_len=8), use_cache=True)
        out = model(ids, output_hidden_states=True, output_router_logits=True, use_cache=False)
    assert len(out.hidden_states) == layers + 1 and len(out.router_logits) == layers
