"""T5 conversion at the public sizes (t5-small, flan-t5-base) on the meta device: every stock tensor accounted
for, every tensor of ours produced with the right shape, no memory used."""

import pytest
import torch
import transformers

from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.source import build_config
from fivefold.conversion.validation import check_plan, expected_tensors, our_prefix

# The config.json fields of the public checkpoints that matter for shapes.
T5_SMALL = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, feed_forward_proj="relu")
FLAN_T5_BASE = dict(
    vocab_size=32128, d_model=768, d_kv=64, d_ff=2048, num_layers=12, num_decoder_layers=12, num_heads=12,
    feed_forward_proj="gated-gelu", tie_word_embeddings=False,
)  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "stock_class", "params"),
    [
        (T5_SMALL, "T5ForConditionalGeneration", 60_000_000),
        (FLAN_T5_BASE, "T5ForConditionalGeneration", 247_000_000),
        (FLAN_T5_BASE, "T5EncoderModel", 109_000_000),
    ],
)
def test_public_size_conversion_is_complete(fields, stock_class, params):
    arch = architecture_for_model_type("t5")
    stock_config = transformers.T5Config(**fields, decoder_start_token_id=0)
    with torch.device("meta"):
        stock = getattr(transformers, stock_class)(stock_config)
    shapes = {k: tuple(v.shape) for k, v in stock.state_dict().items()}
    if stock_class != "T5EncoderModel":  # old files also store an unused bias for cross-attention
        shapes["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = (32, fields["num_heads"])
    target = arch.class_named(stock_class)
    config = build_config(arch, {**stock_config.to_dict(), "architectures": [stock_class]}, target, None)
    plan = arch.keys(config).plan(shapes, arch.stock_prefix, our_prefix(arch, target))
    produced, tied = check_plan(arch, target, config, plan, shapes, strict=True)
    expected, _ = expected_tensors(target, config)

    accounted = {s for step in plan.steps for s in step.sources} | set(plan.dropped) | {a for a, _ in plan.aliases}
    assert accounted == set(shapes)
    assert set(expected) == set(produced)
    assert all(produced[key] == expected[key] for key in expected)
    counted = sum(torch.Size(s).numel() for k, s in expected.items() if k not in tied)
    if stock_class == "T5ForConditionalGeneration" and not config.scale_decoder_outputs:
        counted += torch.Size(expected["lm_head.weight"]).numel()  # v1.1 keeps its own head
    assert counted > params  # really the public size
    with torch.device("meta"):
        ours = target(config)
    assert len(ours.encoder.layers) == fields["num_layers"]
    assert ours.config.get_text_config(decoder=True).num_hidden_layers == config.num_decoder_layers
