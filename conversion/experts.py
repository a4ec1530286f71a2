"""Stock transformers 5 keeps a mixture's experts fused into 3-D parameters (`experts.gate_up_proj [E, 2F, C]`,
`experts.down_proj [E, C, F]`); fivefold keeps one module per expert (`experts.{e}.gate_proj/up_proj/down_proj`).
This module goes from one to the other: an in-memory stock block copied into ours, and the key-map rules that read
a checkpoint saved in the fused layout (`save_pretrained(save_original_format=False)`, or an offloaded model)."""

import torch
from torch import nn

from .errors import ConversionError
from .keymap import TRANSFORMS, Rule, Shape, Transform


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


def _unstack_shapes(src: list[Shape]) -> list[Shape]:
    (s,) = src
    return [tuple(s[1:])] * s[0]


def _halves_shapes(src: list[Shape]) -> list[Shape]:
    (s,) = src
    if s[1] % 2:
        raise ConversionError(f"a fused gate/up tensor of shape {s} has an odd number of rows: no gate and up halves")
    return [(s[1] // 2, s[2])] * (2 * s[0])


def _halves(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """[E, 2F, C] -> E gates [F, C], then E ups [F, C]."""
    gate, up = tensors[0].chunk(2, dim=1)
    return [*gate.unbind(0), *up.unbind(0)]


def _fuse_halves(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    half = len(tensors) // 2
    return [torch.cat([torch.stack(tensors[:half]), torch.stack(tensors[half:])], dim=1)]


TRANSFORMS["unstack"] = Transform("unstack", lambda t: list(t[0].unbind(0)), _unstack_shapes, "stack")
TRANSFORMS["stack"] = Transform("stack", lambda t: [torch.stack(list(t))], lambda s: [(len(s), *s[0])], "unstack")
TRANSFORMS["unstack_gate_up"] = Transform("unstack_gate_up", _halves, _halves_shapes, "stack_gate_up")
TRANSFORMS["stack_gate_up"] = Transform(
    "stack_gate_up", _fuse_halves, lambda s: [(len(s) // 2, 2 * s[0][0], s[0][1])], "unstack_gate_up"
)


def fused_expert_rules(stock: str, ours: str, num_experts: int) -> list[Rule]:
    """Reads the fused layout of `num_experts` experts (`{stock}.gate_up_proj [E, 2F, C]`, `{stock}.down_proj
    [E, C, F]`) into ours (`{ours}.{e}.gate_proj.weight`, ...). Import only: conversion back writes the per-expert
    layout the Hub holds, which stock reads as well."""

    def each(name: str) -> tuple[str, ...]:
        return tuple(f"{ours}.{e}.{name}.weight" for e in range(num_experts))

    return [
        Rule((f"{stock}.gate_up_proj",), each("gate_proj") + each("up_proj"), "unstack_gate_up", import_only=True),
        Rule((f"{stock}.down_proj",), each("down_proj"), "unstack", import_only=True),
    ]
