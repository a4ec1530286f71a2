"""Routers of a mixture-of-experts layer: a linear layer scores every expert, then a routing rule, chosen by name
(`MoESpec.routing`, a key in `ROUTINGS`), picks each token's experts and their weights from the scores.

A rule is a plain function `(logits [N, E], top_k, renormalize) -> (weights [N, R], experts [N, R])`; the weights
come back in the dtype the experts' outputs are weighted in. A new rule is one more entry in `ROUTINGS`.

Shapes: N tokens, C channels, E experts, R experts per token.
"""

from collections.abc import Callable

import torch
from torch import nn

Routing = Callable[[torch.Tensor, int, bool], tuple[torch.Tensor, torch.Tensor]]


class TopKRouter(nn.Linear):
    """The router: a linear layer scoring every expert (`router.weight` [E, C], a bias where the recipe asks).
    An nn.Linear, so that tools adapting linear layers reach it (LoRA's "all-linear" adapts stock's router too)."""

    def __init__(self, hidden_size: int, num_experts: int, bias: bool = False):
        super().__init__(hidden_size, num_experts, bias=bias)

    def reset_parameters(self) -> None:
        # A model initialises it by role (`_init_weights`); here it only starts finite, drawing no random numbers,
        # so that building a model consumes the random stream exactly as a model with a bare router parameter.
        nn.init.zeros_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class RouterLogits(nn.Identity):
    """The logits that route the tokens pass through here, where `output_router_logits` records them: after the
    router, with whatever a tool adapting it (LoRA) adds."""


def softmax_top_k(logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts in fp32, the top k kept, renormalised to sum to one if asked (Mixtral always;
    Qwen2-MoE, Qwen3-MoE and OLMoE by `norm_topk_prob`). Weights stay fp32, as Mixtral weighs in fp32."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def softmax_top_k_in_logits_dtype(
    logits: torch.Tensor, top_k: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`softmax_top_k`, its weights then cast to the logits' dtype (Qwen2-MoE, Qwen3-MoE, OLMoE): in bf16 the
    experts' outputs are weighted in bf16, as stock's are."""
    weights, experts = softmax_top_k(logits, top_k, renormalize)
    return weights.to(logits.dtype), experts


def top_k_softmax(logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's routing: the k largest logits (the router's bias included), then a softmax over those k alone, so
    the weights always sum to one (`renormalize` has nothing to do). Weights in fp32."""
    values, experts = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(values.float(), dim=-1), experts


ROUTINGS: dict[str, Routing] = {
    "softmax_top_k": softmax_top_k,
    "softmax_top_k_in_logits_dtype": softmax_top_k_in_logits_dtype,
    "top_k_softmax": top_k_softmax,
}


def routing(name: str) -> Routing:
    if name not in ROUTINGS:
        raise ValueError(f"unknown routing {name!r}; valid: {', '.join(sorted(ROUTINGS))}")
    return ROUTINGS[name]
