"""Stock transformers 5 keeps a mixture's experts fused into 3-D parameters (`experts.gate_up_proj [E, 2F, C]`,
`experts.down_proj [E, C, F]`); fivefold keeps one module per expert (`experts.{e}.gate_proj/up_proj/down_proj`).
This module goes from one to the other: an in-memory stock block copied into ours, and the key-map rules that read
a checkpoint saved in the fused layout (`save_pretrained(save_original_format=False)`, or an offloaded model)."""

import torch
from torch import nn


@torch.no_grad()
def copy_stock_moe_block(stock: nn.Module, ours: nn.Module) -> None:
    """Copies an in-memory stock sparse block (Mixtral's, Qwen2-MoE's with its shared expert, Qwen3-MoE's,
    OLMoE's: a `gate` router and fused `experts`) into a fivefold `MixtureOfExperts`."""
    width = stock.experts.down_proj.shape[-1]
    ours.router.weight.copy_(stock.gate.weight)
    for e, expert in enumerate(ours.experts):
        expert.gate_proj.weight.copy_(stock.experts.gate_up_proj[e, :width])
        expert.up_proj.weight.copy_(stock.experts.gate_up_proj[e, width:])
        expert.down_proj.weight.copy_(stock.experts.down_proj[e])
    if hasattr(stock, "shared_expert"):
        ours.shared_expert.expert.load_state_dict(stock.shared_expert.state_dict())
        ours.shared_expert.gate.weight.copy_(stock.shared_expert_gate.weight)
