"""Public Mixtral checkpoints (`model.` prefix on head models): one tensor per expert projection
(`block_sparse_moe.experts.E.w1/w2/w3`), the same layout as fivefold's per-expert modules, so conversion is a
plain rename. Sharded files are read through their index like any other checkpoint."""

import torch
from torch import nn

from .keymap import KeyMap, renames

MIXTRAL_BASE = {
    "embed_tokens": "embeddings.word_embeddings",
    "layers.{}.input_layernorm": "layers.{}.norm_before_attn",
    "layers.{}.self_attn.q_proj": "layers.{}.attn.q_proj",
    "layers.{}.self_attn.k_proj": "layers.{}.attn.k_proj",
    "layers.{}.self_attn.v_proj": "layers.{}.attn.v_proj",
    "layers.{}.self_attn.o_proj": "layers.{}.attn.o_proj",
    "layers.{}.post_attention_layernorm": "layers.{}.norm_before_mlp",
    "layers.{}.block_sparse_moe.gate": "layers.{}.mlp.router",
    "layers.{}.block_sparse_moe.experts.{}.w1": "layers.{}.mlp.experts.{}.gate_proj",
    "layers.{}.block_sparse_moe.experts.{}.w3": "layers.{}.mlp.experts.{}.up_proj",
    "layers.{}.block_sparse_moe.experts.{}.w2": "layers.{}.mlp.experts.{}.down_proj",
    "norm": "norm",
}

MIXTRAL_HEADS = {"lm_head": "lm_head", "score": "score"}

MIXTRAL_KEYS = KeyMap(renames(MIXTRAL_BASE), renames(MIXTRAL_HEADS))


@torch.no_grad()
def copy_stock_moe_block(stock: nn.Module, ours: nn.Module) -> None:
    """Copies an in-memory stock `MixtralSparseMoeBlock` (transformers 5 fuses its experts into
    `gate_up_proj [E, 2F, C]` and `down_proj [E, C, F]`) into a fivefold `MixtureOfExperts`."""
    width = stock.experts.down_proj.shape[-1]
    ours.router.weight.copy_(stock.gate.weight)
    for e, expert in enumerate(ours.experts):
        expert.gate_proj.weight.copy_(stock.experts.gate_up_proj[e, :width])
        expert.up_proj.weight.copy_(stock.experts.gate_up_proj[e, width:])
        expert.down_proj.weight.copy_(stock.experts.down_proj[e])
