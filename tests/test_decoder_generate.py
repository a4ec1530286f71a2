"""The decoder stack with a cache: generate() (greedy, beam, sampling) token for token equal to stock on batched
left-padded prompts, incremental decoding equal to one full forward, both names of the cache argument, and the
language-modelling loss of stock GPT-2."""

import pytest
import torch
import transformers

from fivefold.conversion.inputs import causal_text_sample
from fivefold.modeling.decoder import CACHE_FIELD
from fivefold.modeling.gpt2 import FivefoldGPT2LMHeadModel

NEW = 24


@pytest.fixture(scope="module")
def lm_pair(converted):
    def make(attn: str = "sdpa"):
        src, dst = converted("gpt2", "GPT2LMHeadModel")
        stock = transformers.GPT2LMHeadModel.from_pretrained(src, attn_implementation=attn).eval()
        return stock, FivefoldGPT2LMHeadModel.from_pretrained(dst, attn_implementation=attn).eval()

    return make


def _prompts(config):
    inputs = causal_text_sample(config, "GPT2LMHeadModel")  # 3 rows of 12, 4, 8 real tokens, padded on the left
    assert inputs["attention_mask"][:, 0].min() == 0
    return inputs["input_ids"], inputs["attention_mask"]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "options",
    [
        dict(do_sample=False),
        dict(do_sample=False, num_beams=3, num_return_sequences=2),
        dict(do_sample=True, top_k=20, temperature=0.8),
    ],
    ids=["greedy", "beam", "sample"],
)
def test_generate_matches_stock_token_for_token(lm_pair, attn, options, linear_path):
    stock, ours = lm_pair(attn)
    ids, mask = _prompts(stock.config)
    outputs = []
    for model in (stock, ours):
        torch.manual_seed(7)
        outputs.append(model.generate(ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, **options))
    expected, got = outputs
    assert expected.shape[1] == ids.shape[1] + NEW
    assert torch.equal(expected, got)


def test_generate_without_attention_mask_and_batch_of_one(lm_pair):
    stock, ours = lm_pair()
    ids = torch.tensor([[5, 17, 42, 8, 90]])
    kwargs = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    assert torch.equal(stock.generate(ids, **kwargs), ours.generate(ids, **kwargs))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_incremental_decoding_equals_one_full_forward(lm_pair, attn):
    _, ours = lm_pair(attn)
    ids, mask = _prompts(ours.config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: each row counts from its first token
    with torch.no_grad():
        full = ours(ids, attention_mask=mask, position_ids=positions).logits  # [B, T, V]
        prefill = 6
        out = ours(ids[:, :prefill], attention_mask=mask[:, :prefill], position_ids=positions[:, :prefill])
        steps = [out.logits]
        cache = getattr(out, CACHE_FIELD)
        for t in range(prefill, ids.shape[1]):
            out = ours(
                ids[:, t : t + 1], attention_mask=mask[:, : t + 1], position_ids=positions[:, t : t + 1], cache=cache
            )
            steps.append(out.logits)
            cache = getattr(out, CACHE_FIELD)
    assert cache.get_seq_length() == ids.shape[1]
    stepped = torch.cat(steps, dim=1)
    assert (full - stepped)[mask.bool()].abs().max() <= 1e-5


def test_cache_under_both_argument_names_and_logits_to_keep(lm_pair):
    _, ours = lm_pair()
    ids = torch.tensor([[5, 17, 42, 8, 90, 11]])
    with torch.no_grad():
        full = ours(ids, use_cache=False)
        assert getattr(full, CACHE_FIELD) is None
        first = ours(ids[:, :4], use_cache=True)
        cache = getattr(first, CACHE_FIELD)
        by_new_name = ours(ids[:, 4:], cache=cache, logits_to_keep=1)
        assert by_new_name.logits.shape == (1, 1, ours.config.vocab_size)
        first = ours(ids[:, :4], use_cache=True)
        by_old_name = ours(ids[:, 4:], past_key_values=getattr(first, CACHE_FIELD))
    assert getattr(by_old_name, CACHE_FIELD).get_seq_length() == 6
    assert (by_new_name.logits[:, -1] - by_old_name.logits[:, -1]).abs().max() <= 1e-6
    assert (full.logits[:, -1] - by_old_name.logits[:, -1]).abs().max() <= 1e-5


def test_lm_loss_and_gradients_match_stock(lm_pair):
    stock, ours = lm_pair("eager")
    ids, mask = _prompts(stock.config)
    labels = ids.masked_fill(mask == 0, -100)
    losses = []
    for model in (stock, ours):
        model.zero_grad()
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses.append(loss)
    assert (losses[0] - losses[1]).abs() <= 1e-5
    stock_grad = stock.transformer.h[1].mlp.c_fc.weight.grad.t()
    assert (stock_grad - ours.model.layers[1].mlp.up_proj.weight.grad).abs().max() <= 1e-5


def test_training_steps_lower_the_loss(converted):
    _, dst = converted("gpt2", "GPT2LMHeadModel")
    model = FivefoldGPT2LMHeadModel.from_pretrained(dst, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0).train()
    model.activation_checkpointing_enable()
    ids = torch.randint(3, 99, (4, 16), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        out = model(ids, labels=ids)
        assert getattr(out, CACHE_FIELD) is None  # no cache while training with checkpointed layers
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0] - 0.5
