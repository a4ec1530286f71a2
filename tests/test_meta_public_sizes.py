"""Conversion at the public sizes, on the meta device: every stock tensor accounted for, every tensor of ours
produced with the right shape, no memory used."""

import pytest
import torch
import transformers

from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.keymap import legacy_norm_names
from fivefold.conversion.source import build_config
from fivefold.conversion.validation import check_plan, expected_tensors, our_prefix

# The config.json of the public checkpoints (fields that matter for shapes).
BERT_BASE_UNCASED = dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    max_position_embeddings=512, type_vocab_size=2, pad_token_id=0, hidden_act="gelu", layer_norm_eps=1e-12,
)  # fmt: skip
ROBERTA_BASE = dict(
    vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    layer_norm_eps=1e-5,
)  # fmt: skip


def _to_legacy(key: str) -> str:
    # bert-base-uncased's files use TF-era names: LayerNorm.gamma / LayerNorm.beta
    return key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")


@pytest.mark.parametrize(
    ("model_type", "fields", "stock_class", "legacy"),
    [
        ("bert", BERT_BASE_UNCASED, "BertForPreTraining", True),
        ("bert", BERT_BASE_UNCASED, "BertModel", False),
        ("roberta", ROBERTA_BASE, "RobertaForMaskedLM", False),
        ("roberta", ROBERTA_BASE, "RobertaModel", False),
    ],
)
def test_public_size_conversion_is_complete(model_type, fields, stock_class, legacy):
    arch = architecture_for_model_type(model_type)
    stock_config = transformers.AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        stock = getattr(transformers, stock_class)(stock_config)
    shapes = {k: tuple(v.shape) for k, v in stock.state_dict().items()}
    prefix = "" if stock_class.endswith("Model") else f"{stock.base_model_prefix}."
    shapes[f"{prefix}embeddings.position_ids"] = (1, fields["max_position_embeddings"])  # stored by old files
    if legacy:
        shapes = {_to_legacy(k): v for k, v in shapes.items()}
        assert any(k.endswith("gamma") for k in shapes)
    target = arch.class_named(stock_class)
    config = build_config(arch, {**stock_config.to_dict(), "architectures": [stock_class]}, target, None)
    plan = arch.keys(config).plan(shapes, arch.stock_prefix, our_prefix(arch, target))
    produced, tied = check_plan(arch, target, config, plan, shapes, strict=True)
    expected, _ = expected_tensors(target, config)

    accounted = {s for step in plan.steps for s in step.sources} | set(plan.dropped) | {a for a, _ in plan.aliases}
    assert accounted == set(shapes)
    assert set(expected) - set(tied) <= set(produced)
    extras = set(produced) - set(expected)  # kept for the round trip: only other heads' tensors
    assert all(k.startswith(("model.pooler.", "nsp_head.", "lm_head.", "pooler.")) for k in extras), extras
    for key in expected:
        if key in produced:
            assert produced[key] == expected[key], key
    params = sum(torch.Size(s).numel() for k, s in expected.items() if k not in tied)
    assert params > 80_000_000  # really the public size
    assert legacy_norm_names("x.LayerNorm.gamma") == "x.LayerNorm.weight"
