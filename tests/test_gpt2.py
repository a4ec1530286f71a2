"""GPT-2 against stock on the same weights: left-padded and ragged batches, the attention scaling options, the
files of the original uploads (no prefix, stored mask buffers; also at the public size on the meta device), head
semantics, the cache (incremental decoding, both argument names), the language-modelling loss and training."""

import json

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import save_file

import fivefold
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.inputs import causal_text_sample, left_padded, text_inputs
from fivefold.conversion.verify import compare, verify
from fivefold.modeling.decoder import CACHE_FIELD

from helpers import plan_on_meta, public_stock_model, read_tensors, shapes_on_disk, stock_parameters

ARCH = architecture_for_model_type("gpt2")
TOL = 1e-4


def _pair(converted, stock_name, attn="sdpa", **overrides):
    src, dst = converted("gpt2", stock_name, **overrides)
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=attn).eval()
    ours = ARCH.class_named(stock_name).from_pretrained(dst, attn_implementation=attn)
    return stock, ours.eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("stock_name", ["GPT2LMHeadModel", "GPT2ForSequenceClassification"])
def test_left_padded_ragged_batch_matches_stock(converted, stock_name, attn):
    stock, ours = _pair(converted, stock_name, attn)
    inputs = causal_text_sample(stock.config, stock_name)
    assert inputs["attention_mask"][:, 0].min() == 0 and inputs["attention_mask"][:, -1].min() == 1
    diffs = compare(stock, ours, inputs)
    assert max(diffs.values()) <= TOL, diffs
    # With positions counted from each row's first real token, as generate() passes them.
    inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    diffs = compare(stock, ours, inputs)
    assert max(diffs.values()) <= TOL, diffs


@pytest.mark.parametrize(
    "overrides",
    [{"scale_attn_weights": False}, {"scale_attn_by_inverse_layer_idx": True}, {"activation_function": "relu"}],
)
def test_attention_scaling_and_activation_options_match_stock(converted, overrides):
    stock, ours = _pair(converted, "GPT2LMHeadModel", "eager", **overrides)
    assert all(getattr(ours.config, k) == v for k, v in overrides.items())
    diffs = compare(stock, ours, text_inputs(stock.config))
    assert max(diffs.values()) <= TOL, diffs


def test_unimplemented_stock_options_are_refused():
    with pytest.raises(StrictDataclassClassValidationError, match="reorder_and_upcast_attn"):
        fivefold.FivefoldGPT2Config(reorder_and_upcast_attn=True)
    with pytest.raises(StrictDataclassClassValidationError, match="add_cross_attention"):
        fivefold.FivefoldGPT2Config(add_cross_attention=True)
    with pytest.raises(StrictDataclassClassValidationError, match="num_attention_heads"):
        fivefold.FivefoldGPT2Config(n_embd=30, n_head=4)


def test_legacy_layout_without_prefix_and_with_mask_buffers(converted, tmp_path):
    """The files of the original GPT-2 uploads: no `transformer.` prefix and a stored causal mask per layer."""
    src, _ = converted("gpt2", "GPT2LMHeadModel")
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    state = {k.removeprefix("transformer."): v for k, v in read_tensors(src).items()}
    n_pos = json.loads((src / "config.json").read_text())["n_positions"]
    for layer in range(2):
        state[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool))[None, None]
        state[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    assert not any(k.startswith("transformer.") for k in state)
    save_file(state, legacy / "model.safetensors")
    (legacy / "config.json").write_text((src / "config.json").read_text())
    dst = fivefold.convert(legacy, tmp_path / "converted", progress=False)
    assert set(read_tensors(dst)) == set(read_tensors(converted("gpt2", "GPT2LMHeadModel")[1]))  # the buffers dropped
    assert max(verify(src, dst).values()) <= TOL
    # Loading the legacy folder directly converts it in memory the same way.
    direct = fivefold.FivefoldGPT2LMHeadModel.from_pretrained(legacy).eval()
    again = fivefold.FivefoldGPT2LMHeadModel.from_pretrained(dst).eval()
    ids = torch.randint(3, 99, (2, 9))
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, again(ids).logits)


@pytest.mark.parametrize("stock_class", ["GPT2LMHeadModel", "GPT2Model", "GPT2ForSequenceClassification"])
def test_public_size_legacy_layout_is_complete(stock_class):
    """gpt2 (124M) on the meta device, in the layout of its Hub files: no prefix, mask buffers stored."""
    fields = ARCH.public["openai-community/gpt2"]
    stock = public_stock_model(ARCH, fields, stock_class)
    shapes = {k.removeprefix("transformer."): v for k, v in shapes_on_disk(stock).items()}
    for layer in range(fields["n_layer"]):
        shapes[f"h.{layer}.attn.bias"] = (1, 1, fields["n_positions"], fields["n_positions"])
        shapes[f"h.{layer}.attn.masked_bias"] = ()
    meta = plan_on_meta(ARCH, stock, shapes)
    assert meta.accounted == set(shapes)
    assert len(meta.plan.dropped) == 24
    assert set(meta.expected) - set(meta.tied) <= set(meta.produced)
    assert all(meta.produced[k] == meta.expected[k] for k in meta.expected if k in meta.produced)
    base = "" if stock_class == "GPT2Model" else "model."
    assert meta.expected[f"{base}layers.11.attn.q_proj.weight"] == (768, 768)
    assert meta.expected[f"{base}layers.11.mlp.up_proj.weight"] == (3072, 768)
    assert meta.parameters == stock_parameters(stock)  # really gpt2's size, 124M


def test_save_pretrained_after_generate_round_trips(converted, tmp_path):
    """generate() leaves the weights as loaded: they save as the same values, the head still tied."""
    _, dst = converted("gpt2", "GPT2LMHeadModel")
    model = fivefold.FivefoldGPT2LMHeadModel.from_pretrained(dst).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False)
    assert model.lm_head.weight is model.model.embeddings.word_embeddings.weight
    model.save_pretrained(tmp_path / "saved")
    saved = read_tensors(tmp_path / "saved")
    assert all(torch.equal(saved[k], before[k]) for k in saved)
    assert set(before) - set(saved) == {"lm_head.weight"}  # tied


def test_sequence_classification_semantics(converted):
    stock, ours = _pair(converted, "GPT2ForSequenceClassification")
    ids = torch.tensor([[5, 6, 7, 0, 0], [0, 0, 8, 9, 10]])  # right and left padding, pad id 0
    with torch.no_grad():
        expected, got = stock(ids).logits, ours(ids).logits
        assert (expected - got).abs().max() <= TOL
        # Without a pad token, a batch of one scores its last token and a larger batch is refused, as in stock.
        stock.config.pad_token_id = ours.config.pad_token_id = None
        assert (stock(ids[:1]).logits - ours(ids[:1]).logits).abs().max() <= TOL
        with pytest.raises(ValueError, match="no padding token"):
            ours(ids)
        embeds = ours.get_input_embeddings()(ids[:1])
        assert (stock(inputs_embeds=embeds).logits - ours(inputs_embeds=embeds).logits).abs().max() <= TOL


def test_token_types_go_through_the_word_table(converted):
    stock, ours = _pair(converted, "GPT2Model")
    inputs = left_padded(text_inputs(stock.config))
    mask = inputs["attention_mask"]
    inputs["token_type_ids"] = (torch.arange(mask.shape[1]) >= mask.shape[1] // 2).long() * mask  # ids 0 and 1
    diffs = compare(stock, ours, inputs)
    assert max(diffs.values()) <= TOL, diffs


def test_bad_inputs_are_named(converted):
    _, ours = _pair(converted, "GPT2LMHeadModel")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ours(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="position table"):
        ours(torch.ones(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        ours(torch.ones(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="exactly one of"):
        ours()


# --- the cache, the loss, training ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_pair(converted):
    def make(attn: str = "sdpa"):
        src, dst = converted("gpt2", "GPT2LMHeadModel")
        stock = transformers.GPT2LMHeadModel.from_pretrained(src, attn_implementation=attn).eval()
        return stock, fivefold.FivefoldGPT2LMHeadModel.from_pretrained(dst, attn_implementation=attn).eval()

    return make


def _prompts(config):
    inputs = causal_text_sample(config, "GPT2LMHeadModel")  # 3 rows of 12, 4, 8 real tokens, padded on the left
    assert inputs["attention_mask"][:, 0].min() == 0
    return inputs["input_ids"], inputs["attention_mask"]


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
    model = fivefold.FivefoldGPT2LMHeadModel.from_pretrained(
        dst, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    ).train()
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
