"""Mixture of experts: a top-k router sends each token to k of E gated feed-forward experts and mixes their outputs.

Every expert is its own module (a `GatedFeedForward`), so `device_map` can put the experts of one layer on
different devices: each expert's output is moved back to where the layer combines tokens, and the checkpoint
layout (`experts.{e}.gate_proj/up_proj/down_proj`) never depends on the placement. Tokens are dispatched grouped
by expert (one sort, one host sync for the group sizes). In training every expert runs, on an empty slice when no
token chose it: its gradient is then zero rather than missing, so data-parallel training (DDP with
`find_unused_parameters=False` or `static_graph`, gradient checkpointing) sees the same parameters used on every
rank at every step. Without gradients, experts that received no token are skipped.

Shapes: B batch, T time, C channels, N tokens (B * T), E experts, R experts per token, A assignments,
F inner width.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .expert_paths import weighted_experts
from .feedforward import ClampedSwiGLU, FeedForwardSpec, GatedFeedForward
from .tracing import tracing


@dataclass(frozen=True)
class MoESpec:
    hidden_size: int
    expert_size: int  # F, each expert's inner width
    num_experts: int
    top_k: int  # experts per token
    activation: str = "silu"  # SwiGLU experts
    jitter_noise: float = 0.0  # in training, inputs scaled by U(1 - noise, 1 + noise), as in Mixtral
    kind: str = "moe"  # its key in feedforward.FEEDFORWARDS, so that a block builds it like any feed-forward
    routing: str = "softmax_top_k"  # key in ROUTINGS: how router logits become each token's experts and weights
    router_bias: bool = False
    expert: str = "gated"  # key in EXPERTS
    expert_bias: bool = False
    swiglu_limit: float | None = None  # the clamped SwiGLU's bound and gain (expert="clamped_swiglu")
    swiglu_alpha: float = 1.702

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be between 1 and num_experts ({self.num_experts})")
        for name, table in (("routing", ROUTINGS), ("expert", EXPERTS)):
            if getattr(self, name) not in table:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(sorted(table))}")


class TopKRouter(nn.Linear):
    """Mixtral's router: a linear layer scoring every expert (`router.weight` [E, C], no bias). An nn.Linear, so
    that tools adapting linear layers reach it (LoRA's "all-linear" adapts stock's router too); the routing is
    `top_k_routing` on its scores."""

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


def top_k_routing(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral's routing: softmax over all experts in fp32, the top k kept and renormalised to sum to one.
    logits [N, E] -> weights [N, R] fp32, experts [N, R]."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), experts


def top_k_then_softmax(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's routing: the k largest logits (the router's bias included), a softmax over those k alone.
    logits [N, E] -> weights [N, R] fp32, experts [N, R]."""
    values, experts = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(values.float(), dim=-1), experts


ROUTINGS = {"softmax_top_k": top_k_routing, "top_k_softmax": top_k_then_softmax}
EXPERTS: dict[str, type[nn.Module]] = {"gated": GatedFeedForward, "clamped_swiglu": ClampedSwiGLU}


class MixtureOfExperts(nn.Module):
    def __init__(self, spec: MoESpec):
        super().__init__()
        self.top_k = spec.top_k
        self.jitter_noise = spec.jitter_noise
        self.router = TopKRouter(spec.hidden_size, spec.num_experts, bias=spec.router_bias)
        self.router_logits = RouterLogits()
        self.routing = ROUTINGS[spec.routing]
        expert = FeedForwardSpec(
            spec.expert,
            spec.hidden_size,
            spec.expert_size,
            spec.activation,
            bias=spec.expert_bias,
            limit=spec.swiglu_limit,
            alpha=spec.swiglu_alpha,
        )
        self.experts = nn.ModuleList(EXPERTS[spec.expert](expert) for _ in range(spec.num_experts))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, C]
        x = hidden_states.reshape(-1, hidden_states.shape[-1])  # [N, C]
        if self.training and self.jitter_noise > 0:
            x = x * torch.empty_like(x).uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
        logits = self.router_logits(self.router(x))  # [N, E], on the router's device (a device_map may choose it)
        weights, experts = self.routing(logits, self.top_k)
        return self.dispatch(x, weights.to(x.device), experts.to(x.device)).view(hidden_states.shape)

    def dispatch(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x: [N, C], weights/experts: [N, R] -> [N, C], each token the weighted sum of its experts' outputs."""
        if tracing():  # no grouping by expert in a graph (expert_paths.py)
            return weighted_experts(x, weights, experts, self.experts)
        flat = experts.reshape(-1)  # [A]
        order = flat.argsort(stable=True)  # [A], assignments grouped by expert
        token = order // self.top_k  # [A], the token of each grouped assignment
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()  # the one host sync
        y = run_experts(self.experts, x[token], counts).to(x.device) * weights.reshape(-1)[order, None]  # [A, C]
        return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))  # fp32 weighting, like Mixtral's


def run_experts(experts: nn.ModuleList, grouped: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """grouped: [A, C], the rows of each expert in turn (counts[e] rows for expert e) -> [A, C], each row through
    its expert. With gradients every expert runs, on zero rows if need be, so that each gets a (zero) gradient."""
    outputs, start = [], 0
    for expert, count in zip(experts, counts, strict=True):
        if count or torch.is_grad_enabled():
            # An expert placed on another device answers there; the rows are gathered where `grouped` lives.
            outputs.append(expert(grouped[start : start + count]).to(grouped.device))
            start += count
    return torch.cat(outputs) if outputs else grouped


def load_balancing_loss(
    router_logits: tuple[torch.Tensor, ...],  # per layer [N, E]
    top_k: int,
    attention_mask: torch.Tensor | None = None,  # [B, T], 1 = token; N = B*T
    group=None,  # a torch.distributed group whose ranks' tokens count together (data parallelism)
) -> torch.Tensor:
    """Switch Transformer's auxiliary loss as Mixtral computes it: E * sum_e (share of assignments to e) *
    (mean router probability of e), over all layers' tokens together, padding excluded. With a `group`, the shares
    and means are over every rank's tokens (summed with an autograd-aware all-reduce), as one process would
    compute them on the joint batch."""
    device = router_logits[0].device
    num_experts = router_logits[0].shape[-1]
    probs = torch.cat([logits.to(device) for logits in router_logits]).float().softmax(dim=-1)  # [L*N, E]
    chosen = F.one_hot(probs.topk(top_k, dim=-1).indices, num_experts).sum(dim=1).float()  # [L*N, E]
    if attention_mask is None:
        mask = torch.ones(probs.shape[0], 1, device=device)
    else:
        mask = attention_mask.reshape(-1, 1).to(device, torch.float32).repeat(len(router_logits), 1)  # [L*N, 1]
    sums = torch.cat([mask.sum().view(1), (chosen * mask).sum(dim=0), (probs * mask).sum(dim=0)])  # [1 + 2E]
    if group is not None:
        from torch.distributed.nn.functional import all_reduce

        sums = all_reduce(sums, group=group)
    tokens, assigned, prob = sums[0], sums[1 : 1 + num_experts], sums[1 + num_experts :]
    return num_experts * (assigned / tokens * prob / tokens).sum()


def router_z_loss(
    router_logits: tuple[torch.Tensor, ...],  # per layer [N, E]
    attention_mask: torch.Tensor | None = None,  # [B, T]
) -> torch.Tensor:
    """ST-MoE's z-loss: the mean squared log-sum-exp of the router logits, keeping them small."""
    device = router_logits[0].device
    z = torch.cat([logits.to(device) for logits in router_logits]).float().logsumexp(dim=-1).square()  # [L*N]
    if attention_mask is None:
        return z.mean()
    mask = attention_mask.reshape(-1).to(device, torch.float32).repeat(len(router_logits))  # [L*N]
    return (z * mask).sum() / mask.sum()
