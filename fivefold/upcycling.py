"""Upcycling: a dense Llama-style decoder turned into a Mixtral whose experts all start as copies of its MLP.

With identical experts the mixture's output equals the dense model's whatever the router picks (the chosen
experts' weights sum to one), so the upcycled model starts exactly where the dense one was; fine-tuning then
lets the experts, and the router, drift apart. The router starts random. The checkpoint is written in the
public per-expert Mixtral layout, so stock `MixtralForCausalLM` and fivefold's load it alike.
"""

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

# The dense MLP's projections -> their names in a Mixtral expert.
EXPERT_NAMES = {"gate_proj.weight": "w1", "up_proj.weight": "w3", "down_proj.weight": "w2"}


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


def upcycle(dense: transformers.PreTrainedModel, folder: str | Path, experts: int, top_k: int, seed: int = 0) -> Path:
    """Writes `folder`: a stock Mixtral checkpoint (config.json, model.safetensors) from a Llama-style causal LM,
    each layer's MLP copied into `experts` experts and a random router choosing `top_k` of them."""
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
            tensors[f"{layer}.block_sparse_moe.experts.{e}.{EXPERT_NAMES[projection]}.weight"] = value.clone()
        tensors[f"{layer}.block_sparse_moe.gate.weight"] = torch.randn(experts, c.hidden_size, generator=gen)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = mixtral_config(c, experts, top_k)
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    return folder
