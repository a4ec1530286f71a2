"""GPT-2 against stock on the same weights: left-padded and ragged batches, the legacy file layout, the attention
scaling options, head semantics, the round trip, and conversion at the public size on the meta device."""

import json

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file, save_file

import fivefold
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.inputs import causal_text_sample, left_padded, text_inputs
from fivefold.conversion.source import build_config
from fivefold.conversion.validation import check_plan, expected_tensors, our_prefix
from fivefold.conversion.verify import compare, verify
from fivefold.modeling.gpt2 import FivefoldGPT2LMHeadModel, FivefoldGPT2Model

TOL = 1e-4


def _tensors(folder):
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _pair(converted, stock_name, attn="sdpa", **overrides):
    src, dst = converted("gpt2", stock_name, **overrides)
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=attn).eval()
    ours = architecture_for_model_type("gpt2").class_named(stock_name).from_pretrained(dst, attn_implementation=attn)
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
    state = {k.removeprefix("transformer."): v for k, v in _tensors(src).items()}
    n_pos = json.loads((src / "config.json").read_text())["n_positions"]
    for layer in range(2):
        state[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool))[None, None]
        state[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    assert not any(k.startswith("transformer.") for k in state)
    save_file(state, legacy / "model.safetensors")
    (legacy / "config.json").write_text((src / "config.json").read_text())
    dst = fivefold.convert(legacy, tmp_path / "converted", progress=False)
    assert set(_tensors(dst)) == set(_tensors(converted("gpt2", "GPT2LMHeadModel")[1]))  # the buffers dropped
    assert max(verify(src, dst).values()) <= TOL
    # Loading the legacy folder directly converts it in memory the same way.
    direct = FivefoldGPT2LMHeadModel.from_pretrained(legacy).eval()
    again = FivefoldGPT2LMHeadModel.from_pretrained(dst).eval()
    ids = torch.randint(3, 99, (2, 9))
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, again(ids).logits)


@pytest.mark.parametrize("stock_name", ["GPT2LMHeadModel", "GPT2Model", "GPT2ForTokenClassification"])
def test_export_restores_stock_checkpoint(converted, tmp_path, stock_name):
    src, dst = converted("gpt2", stock_name)
    ours = _tensors(dst)
    assert "model.layers.0.attn.q_proj.weight" in ours or "layers.0.attn.q_proj.weight" in ours
    out = fivefold.export(dst, tmp_path / "stock-again", progress=False)
    original, exported = _tensors(src), _tensors(out)
    assert set(original) == set(exported)
    assert all(torch.equal(original[k], exported[k]) for k in original)
    assert json.loads((out / "config.json").read_text())["architectures"] == [stock_name]


def test_save_pretrained_after_generate_round_trips(converted, tmp_path):
    """generate() leaves the weights as loaded: they save as the same values, the head still tied."""
    _, dst = converted("gpt2", "GPT2LMHeadModel")
    model = FivefoldGPT2LMHeadModel.from_pretrained(dst).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False)
    assert model.lm_head.weight is model.model.embeddings.word_embeddings.weight
    model.save_pretrained(tmp_path / "saved")
    saved = _tensors(tmp_path / "saved")
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


GPT2_PUBLIC = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)


@pytest.mark.parametrize("stock_class", ["GPT2LMHeadModel", "GPT2Model", "GPT2ForSequenceClassification"])
def test_public_size_conversion_is_complete(stock_class):
    """gpt2 (124M) on the meta device, in the layout of its Hub files: no prefix, mask buffers stored."""
    arch = architecture_for_model_type("gpt2")
    stock_config = transformers.GPT2Config(**GPT2_PUBLIC, pad_token_id=50256)
    with torch.device("meta"):
        stock = getattr(transformers, stock_class)(stock_config)
    shapes = {k.removeprefix("transformer."): tuple(v.shape) for k, v in stock.state_dict().items()}
    for layer in range(12):
        shapes[f"h.{layer}.attn.bias"] = (1, 1, 1024, 1024)
        shapes[f"h.{layer}.attn.masked_bias"] = ()
    target = arch.class_named(stock_class)
    config = build_config(arch, {**stock_config.to_dict(), "architectures": [stock_class]}, target, None)
    plan = arch.keys(config).plan(shapes, arch.stock_prefix, our_prefix(arch, target))
    produced, tied = check_plan(arch, target, config, plan, shapes, strict=True)
    expected, _ = expected_tensors(target, config)
    accounted = {s for step in plan.steps for s in step.sources} | set(plan.dropped) | {a for a, _ in plan.aliases}
    assert accounted == set(shapes)
    assert len(plan.dropped) == 24
    assert set(expected) - set(tied) <= set(produced)
    assert all(produced[k] == expected[k] for k in expected if k in produced)
    base = "" if target is FivefoldGPT2Model else "model."
    assert expected[f"{base}layers.11.attn.q_proj.weight"] == (768, 768)
    assert expected[f"{base}layers.11.mlp.up_proj.weight"] == (3072, 768)
    params = sum(torch.Size(s).numel() for k, s in expected.items() if k not in tied)
    assert 124_000_000 < params < 125_000_000  # really gpt2's size
