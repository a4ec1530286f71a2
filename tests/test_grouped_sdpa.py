"""On the CPU, sdpa reads grouped key/value heads where they are (modeling/grouped_sdpa.py): traced by dynamo, with
a padding mask or none, at the prefill and at a decoding step, no head is copied per query head and the logits are
eager attention's; in eager, every call equals transformers' sdpa; `torch.jit.trace` goes to transformers'."""

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from fivefold.conversion.llama import TINY_LLAMA_LIKE
from fivefold.modeling.grouped_sdpa import grouped_sdpa_attention, reads_grouped_heads
from fivefold.modeling.kernels import attention_kernel


def tiny_llama(attn: str) -> transformers.PreTrainedModel:
    from fivefold.configuration.llama import FivefoldLlamaConfig
    from fivefold.modeling.llama import FivefoldLlamaForCausalLM

    torch.manual_seed(0)
    config = FivefoldLlamaConfig(**TINY_LLAMA_LIKE, attn_implementation=attn)
    return FivefoldLlamaForCausalLM(config).eval()


def key_heads_seen_by_sdpa(model, **inputs) -> tuple[list[int], torch.Tensor]:
    """Each sdpa call's key heads in the graph dynamo traces of `model(**inputs)`, and its logits."""
    heads = []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        for node in gm.graph.nodes:
            if node.target is F.scaled_dot_product_attention:
                heads.append(node.args[1].meta["example_value"].shape[1])
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        logits = torch.compile(model, backend=backend, fullgraph=True)(**inputs).logits
    torch._dynamo.reset()
    return heads, logits


@pytest.mark.parametrize("padded", [False, True], ids=["no mask", "padding mask"])
def test_traced_sdpa_reads_the_key_value_heads_uncopied_and_equals_eager(padded):
    sdpa, eager = tiny_llama("sdpa"), tiny_llama("eager")
    ids = torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :3] = 0
    cache = transformers.DynamicCache(config=sdpa.config)
    heads, logits = key_heads_seen_by_sdpa(sdpa, input_ids=ids, attention_mask=mask, past_key_values=cache)
    kv_heads = TINY_LLAMA_LIKE["num_key_value_heads"]
    assert heads == [kv_heads] * TINY_LLAMA_LIKE["num_hidden_layers"]  # [4] (the query heads) before the change
    reference = eager(
        input_ids=ids, attention_mask=mask, past_key_values=transformers.DynamicCache(config=eager.config)
    )
    real = mask.bool()
    torch.testing.assert_close(logits[real], reference.logits[real], atol=1e-5, rtol=0)

    step = torch.randint(3, 99, (2, 1), generator=torch.Generator().manual_seed(1))
    step_mask = torch.cat([mask, torch.ones_like(step)], dim=1)
    heads, logits = key_heads_seen_by_sdpa(sdpa, input_ids=step, attention_mask=step_mask, past_key_values=cache)
    assert heads == [kv_heads] * TINY_LLAMA_LIKE["num_hidden_layers"]
    expected = eager(input_ids=step, attention_mask=step_mask, past_key_values=reference.past_key_values).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_sdpa_is_the_grouped_kernel_and_leaves_other_calls_to_transformers():
    model = tiny_llama("sdpa")
    assert attention_kernel(model.config, None) is grouped_sdpa_attention
    module = model.model.layers[0].attn
    query = torch.zeros(1, 4, 1, 8)
    assert reads_grouped_heads(module, query, {})
    assert not reads_grouped_heads(module, query, {"output_attentions": True})
    assert not reads_grouped_heads(module, query.to("meta"), {})


def test_grouped_heads_give_eager_gradients():
    torch.manual_seed(0)
    sdpa, eager = tiny_llama("sdpa").train(), tiny_llama("eager").train()
    ids = torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0  # padded on the right: no real token is predicted from a padded position, whose row differs
    labels = ids.masked_fill(mask == 0, -100)
    grads = []
    for model in (sdpa, eager):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append(model.model.layers[0].attn.q_proj.weight.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("t, s", [(1, 9), (5, 5), (5, 9)], ids=["one query", "prefill", "static cache prefill"])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
@pytest.mark.parametrize("is_causal", [None, False])
def test_every_call_equals_transformers_sdpa(t, s, mask, is_causal):
    module = tiny_llama("sdpa").model.layers[0].attn  # 4 query heads over 2
    g = torch.Generator().manual_seed(0)
    query, key = torch.randn(2, 4, t, 8, generator=g), torch.randn(2, 2, s, 8, generator=g)
    value = torch.randn(2, 2, s, 8, generator=g)
    masks = {
        "none": None,
        "bool": torch.rand(2, 1, t, s, generator=g) > 0.3,
        "float": torch.randn(2, 1, t, s, generator=g),
    }
    attention_mask = masks[mask]
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask[..., 0] = True  # no row without a key: kernels fill such rows differently
    kwargs = dict(scaling=0.3, is_causal=is_causal)
    out, _ = grouped_sdpa_attention(module, query, key, value, attention_mask, **kwargs)
    expected, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    assert out.shape == expected.shape == (2, t, 4, 8) and out.is_contiguous()
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_a_jit_traced_step_goes_to_transformers_sdpa():
    model = tiny_llama("sdpa")
    ids = torch.randint(3, 99, (2, 1), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    with torch.no_grad():
        traced = torch.jit.trace(Logits(), (ids, mask), check_trace=False)  # a tensor `is_causal` before the fix
        torch.testing.assert_close(traced(ids, mask), Logits()(ids, mask), atol=1e-6, rtol=0)
