"""Upcycling: a dense Llama-style decoder turned into a Mixtral (or a Qwen3-MoE) whose experts all start as copies
of its MLP.

With identical experts the mixture's output equals the dense model's whatever the router picks (the chosen
experts' weights sum to one), so the upcycled model starts exactly where the dense one was; fine-tuning then
lets the experts, and the router, drift apart. The router starts random. The checkpoint is written in the
public per-expert layout of the target, so stock's class and fivefold's load it alike. A Qwen3-MoE normalises
each head's queries and keys (RMSNorm, weights of one), which a Llama does not: its upcycled model is
Qwen3-MoE-shaped, not the dense model's equal.
"""

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

# The dense MLP's projections -> their names in a Mixtral expert.
EXPERT_NAMES = {"gate_proj.weight": "w1", "up_proj.weight": "w3", "down_proj.weight": "w2"}
# Per target: the name of expert e's projection p (a dense MLP's name) and of the router, under a layer's prefix.
EXPERT_KEYS = {
    "mixtral": (lambda e, p: f"block_sparse_moe.experts.{e}.{EXPERT_NAMES[p]}.weight", "block_sparse_moe.gate.weight"),
    "qwen3_moe": (lambda e, p: f"mlp.experts.{e}.{p}", "mlp.gate.weight"),
}


def mixtral_config(dense: transformers.PretrainedConfig, experts: int, top_k: int) -> transformers.MixtralConfig:
    c = dense
    return transformers.MixtralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        rope_parameters=c.rope_parameters, max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id, num_local_experts=experts, num_experts_per_tok=top_k,
        architectures=["MixtralForCausalLM"],
    )  # fmt: skip


def qwen3_moe_config(dense: transformers.PretrainedConfig, experts: int, top_k: int) -> transformers.Qwen3MoeConfig:
    c = dense
    return transformers.Qwen3MoeConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, moe_intermediate_size=c.intermediate_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps, rope_parameters=c.rope_parameters,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id, num_experts=experts,
        num_experts_per_tok=top_k, norm_topk_prob=True, architectures=["Qwen3MoeForCausalLM"],
    )  # fmt: skip


CONFIGS = {"mixtral": mixtral_config, "qwen3_moe": qwen3_moe_config}


def upcycle(
    dense: transformers.PreTrainedModel,
    folder: str | Path,
    experts: int,
    top_k: int,
    seed: int = 0,
    into: str = "mixtral",  # or "qwen3_moe"
) -> Path:
    """Writes `folder`: a stock Mixtral (or Qwen3-MoE) checkpoint (config.json, model.safetensors) from a
    Llama-style causal LM, each layer's MLP copied into `experts` experts and a random router choosing `top_k`."""
    if into not in CONFIGS:
        raise ValueError(f"cannot upcycle into {into!r}; valid: {', '.join(sorted(CONFIGS))}")
    expert_key, router_key = EXPERT_KEYS[into]
    folder = Path(folder)
    c = dense.config
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for key, value in dense.state_dict().items():
        if key == "lm_head.weight" and c.tie_word_embeddings:
            continue
        mlp = key.split(".mlp.")
        if len(mlp) == 1:
            tensors[key] = value.contiguous()
            continue
        layer, projection = mlp
        for e in range(experts):
            tensors[f"{layer}.{expert_key(e, projection)}"] = value.clone()
        tensors[f"{layer}.{router_key}"] = torch.randn(experts, c.hidden_size, generator=gen)
        if into == "qwen3_moe" and projection == "down_proj.weight":  # once a layer: its per-head q/k norms
            for norm in ("q_norm", "k_norm"):
                tensors[f"{layer}.self_attn.{norm}.weight"] = torch.ones(c.head_dim)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = CONFIGS[into](c, experts, top_k)
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    return folder
