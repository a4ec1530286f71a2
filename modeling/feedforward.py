"""Position-wise feed-forward networks, chosen by name.

Shapes: B batch, T time, C channels, F inner width.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers.activations import ACT2FN

from .linear import Linear, linear_then_activation, linears_on_one_input


@dataclass(frozen=True)
class FeedForwardSpec:
    kind: str  # key in FEEDFORWARDS
    hidden_size: int
    intermediate_size: int
    activation: str  # key in transformers' ACT2FN
    bias: bool = True
    dropout: float = 0.0  # on the inner activations, in training (T5)
    limit: float | None = None  # clamped SwiGLU: the bound of its gate (from above) and of its up (both sides)
    alpha: float = 1.702  # clamped SwiGLU: the gain inside its sigmoid
    down_in_weight_dtype: bool = False  # the down projection runs in its weight's dtype (T5: OutputProjection)


class OutputProjection(Linear):
    """A down projection that runs in its own weight dtype, which may differ from the activations' when a model
    keeps it in fp32 under fp16 (T5's `wo`, `_keep_in_fp32_modules`), and answers in that dtype, as stock T5
    does: the residual stream it is added to then carries on in fp32, where fp16 would overflow. Chosen by a
    recipe (`FeedForwardSpec.down_in_weight_dtype`): elsewhere a quantizer's weight, whose dtype is the one it was
    quantized from (kept through `model.to(torch.bfloat16)`), must not cast the activations back to it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.weight.dtype
        return super().forward(x if x.dtype == dtype or dtype == torch.int8 else x.to(dtype))


def _down_projection(spec: FeedForwardSpec) -> Linear:
    down = OutputProjection if spec.down_in_weight_dtype else Linear
    return down(spec.intermediate_size, spec.hidden_size, bias=spec.bias)


def activation(name: str) -> nn.Module:
    if name not in ACT2FN:
        raise ValueError(f"unknown activation {name!r}; valid: {', '.join(sorted(ACT2FN))}")
    return ACT2FN[name]


def inner_dropout(p: float) -> nn.Module:
    """Dropout on the inner activations, or nothing where the spec has none: a module with no number to read, which
    a `torch.cond` branch compiled with dynamic shapes would take as a symbolic operand and could not check."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class DenseFeedForward(nn.Module):
    """up -> activation -> down (BERT, RoBERTa, GPT-2, ViT, T5 v1.0)."""

    def __init__(self, spec: FeedForwardSpec):
        super().__init__()
        self.up_proj = Linear(spec.hidden_size, spec.intermediate_size, bias=spec.bias)
        self.act = activation(spec.activation)
        self.dropout = inner_dropout(spec.dropout)
        self.down_proj = _down_projection(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, F] -> [B, T, C]
        return self.down_proj(self.dropout(linear_then_activation(self.up_proj, self.act, x)))


class GatedFeedForward(nn.Module):
    """activation(gate) * up -> down: GeGLU (ModernBERT, T5 v1.1), SwiGLU (Mixtral's experts)."""

    def __init__(self, spec: FeedForwardSpec):
        super().__init__()
        self.gate_proj = Linear(spec.hidden_size, spec.intermediate_size, bias=spec.bias)
        self.up_proj = Linear(spec.hidden_size, spec.intermediate_size, bias=spec.bias)
        self.act = activation(spec.activation)
        self.dropout = inner_dropout(spec.dropout)
        self.down_proj = _down_projection(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, F] -> [B, T, C]
        gate, up = linears_on_one_input(x, self.gate_proj, self.up_proj)
        # Each [N, F] buffer dropped as soon as it is used: no more of them alive at once than in one expression.
        gate = self.act(gate)
        gate = gate * up
        del up
        return self.down_proj(self.dropout(gate))


class ClampedSwiGLU(GatedFeedForward):
    """gpt-oss's experts: the gate clamped from above and the up projection on both sides at `limit`, then
    `(up + 1) * gate * sigmoid(alpha * gate)` -> down."""

    def __init__(self, spec: FeedForwardSpec):
        super().__init__(spec)
        if spec.limit is None:
            raise ValueError("a clamped SwiGLU needs its limit")
        self.limit = spec.limit
        self.alpha = spec.alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, F] -> [B, T, C]
        gate, up = linears_on_one_input(x, self.gate_proj, self.up_proj)
        gate, up = gate.clamp(max=self.limit), up.clamp(min=-self.limit, max=self.limit)
        return self.down_proj(self.dropout((up + 1) * (gate * torch.sigmoid(gate * self.alpha))))
