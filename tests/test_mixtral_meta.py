"""Mixtral-8x7B at its public size on the meta device: every stock tensor accounted for, every tensor of ours
produced with the right shape, eight whole experts per layer, no memory used."""

import re

import pytest
import torch
import transformers

from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.source import build_config
from fivefold.conversion.validation import check_plan, expected_tensors, our_prefix

# mistralai/Mixtral-8x7B-v0.1 config.json (the fields that matter for shapes)
MIXTRAL_8X7B = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
    rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)  # fmt: skip


@pytest.mark.parametrize("stock_class", ["MixtralForCausalLM", "MixtralModel"])
def test_mixtral_8x7b_conversion_is_complete(stock_class):
    arch = architecture_for_model_type("mixtral")
    stock_config = transformers.MixtralConfig(**MIXTRAL_8X7B)
    with torch.device("meta"):
        stock = getattr(transformers, stock_class)(stock_config)
    # v5 fuses experts in memory; the public files hold one tensor per expert projection, as saved.
    shapes = {}
    for key, tensor in stock.state_dict().items():
        fused = re.match(r"(.*)\.mlp\.experts\.(gate_up_proj|down_proj)$", key)
        if not fused:
            shapes[key.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = tuple(tensor.shape)
            continue
        prefix, name = fused.groups()
        experts, rows, cols = tensor.shape
        for e in range(experts):
            base = f"{prefix}.block_sparse_moe.experts.{e}"
            if name == "down_proj":
                shapes[f"{base}.w2.weight"] = (rows, cols)
            else:
                shapes[f"{base}.w1.weight"] = shapes[f"{base}.w3.weight"] = (rows // 2, cols)

    target = arch.class_named(stock_class)
    config = build_config(arch, {**stock_config.to_dict(), "architectures": [stock_class]}, target, None)
    plan = arch.keys(config).plan(shapes, arch.stock_prefix, our_prefix(arch, target))
    produced, tied = check_plan(arch, target, config, plan, shapes, strict=True)
    expected, _ = expected_tensors(target, config)

    assert {s for step in plan.steps for s in step.sources} == set(shapes) and not plan.dropped
    assert set(produced) == set(expected) and not tied
    assert all(produced[k] == expected[k] for k in expected)
    layer = "model.layers.31" if stock_class.endswith("CausalLM") else "layers.31"
    experts = {
        k.removeprefix(f"{layer}.mlp.experts.").split(".")[0] for k in expected if k.startswith(f"{layer}.mlp.experts.")
    }
    assert experts == {str(e) for e in range(8)}
    assert expected[f"{layer}.mlp.experts.7.down_proj.weight"] == (4096, 14336)
    assert expected[f"{layer}.attn.k_proj.weight"] == (1024, 4096)  # 8 key/value heads of 128
    assert expected[f"{layer}.mlp.router.weight"] == (8, 4096)
    params = sum(torch.Size(s).numel() for s in expected.values())
    assert 46_000_000_000 < params < 47_500_000_000  # 46.7B: really the public size
