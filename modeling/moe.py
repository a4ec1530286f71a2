"""Mixture of experts: a top-k router sends each token to k of E gated feed-forward experts and mixes their outputs.

The parts a recipe chooses: the routing rule (routers.py), the kind of expert (`EXPERTS`), a router bias, and an
optional shared expert every token runs beside its routed ones (`SharedExpert`; `NoSharedExpert` when absent).

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

from .expert_paths import traced_experts
from .feedforward import ClampedSwiGLU, FeedForwardSpec, GatedFeedForward
from .linear import Linear
from .routers import RouterLogits, TopKRouter, routing
from .tracing import tracing

# The kinds of routed expert, by name (`MoESpec.expert`): each built from a `FeedForwardSpec` of the expert's size.
EXPERTS: dict[str, type[nn.Module]] = {"gated": GatedFeedForward, "clamped_swiglu": ClampedSwiGLU}


@dataclass(frozen=True)
class MoESpec:
    hidden_size: int
    expert_size: int  # F, each expert's inner width
    num_experts: int
    top_k: int  # experts per token
    activation: str = "silu"  # SwiGLU experts
    jitter_noise: float = 0.0  # in training, inputs scaled by U(1 - noise, 1 + noise), as in Mixtral
    kind: str = "moe"  # its key in feedforward.FEEDFORWARDS, so that a block builds it like any feed-forward
    routing: str = "softmax_top_k"  # key in routers.ROUTINGS
    norm_topk_prob: bool = True  # the chosen experts' weights renormalised to sum to one (for rules that offer it)
    router_bias: bool = False
    expert: str = "gated"  # key in EXPERTS
    expert_bias: bool = False
    shared_expert_size: int = 0  # > 0: a shared expert of this width beside the routed ones, with a sigmoid gate
    swiglu_limit: float | None = None  # the clamped SwiGLU's bound and gain (expert="clamped_swiglu", gpt-oss)
    swiglu_alpha: float = 1.702

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be between 1 and num_experts ({self.num_experts})")
        routing(self.routing)  # a clear error for an unknown rule, at build time
        if self.expert not in EXPERTS:
            raise ValueError(f"unknown expert kind {self.expert!r}; valid: {', '.join(sorted(EXPERTS))}")

    def expert_spec(self, width: int) -> FeedForwardSpec:
        return FeedForwardSpec(
            self.expert,
            self.hidden_size,
            width,
            self.activation,
            bias=self.expert_bias,
            limit=self.swiglu_limit,
            alpha=self.swiglu_alpha,
        )


class SharedExpert(nn.Module):
    """Qwen2-MoE's shared expert: a gated feed-forward every token runs beside its routed experts, its output
    scaled by a sigmoid gate (one score per token) and added to theirs."""

    def __init__(self, spec: MoESpec):
        super().__init__()
        self.expert = GatedFeedForward(spec.expert_spec(spec.shared_expert_size))
        self.gate = Linear(spec.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:  # [N, C], [N, C] -> [N, C]
        # Under a device_map the gate and the expert may answer on devices of their own.
        return routed + torch.sigmoid(self.gate(x)).to(routed.device) * self.expert(x).to(routed.device)


class NoSharedExpert(nn.Module):
    """The absent shared expert: the routed experts' output as is."""

    def forward(self, x: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        return routed


class MixtureOfExperts(nn.Module):
    def __init__(self, spec: MoESpec):
        super().__init__()
        self.top_k = spec.top_k
        self.jitter_noise = spec.jitter_noise
        self.routing = routing(spec.routing)
        self.norm_topk_prob = spec.norm_topk_prob
        self.router = TopKRouter(spec.hidden_size, spec.num_experts, bias=spec.router_bias)
        self.router_logits = RouterLogits()
        kind = EXPERTS[spec.expert]
        self.experts = nn.ModuleList(kind(spec.expert_spec(spec.expert_size)) for _ in range(spec.num_experts))
        self.shared_expert = SharedExpert(spec) if spec.shared_expert_size else NoSharedExpert()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, C]
        x = hidden_states.reshape(-1, hidden_states.shape[-1])  # [N, C]
        if self.training and self.jitter_noise > 0:
            x = x * torch.empty_like(x).uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
        logits = self.router_logits(self.router(x))  # [N, E], on the router's device (a device_map may choose it)
        weights, experts = self.routing(logits, self.top_k, self.norm_topk_prob)
        routed = self.dispatch(x, weights.to(x.device), experts.to(x.device))
        return self.shared_expert(x, routed).view(hidden_states.shape)

    def dispatch(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x: [N, C], weights/experts: [N, R] -> [N, C], each token the weighted sum of its experts' outputs."""
        if tracing():  # no grouping by expert in a graph (expert_paths.py)
            return traced_experts(x, weights, experts, self.experts)
        flat = experts.reshape(-1)  # [A]
        order = flat.argsort(stable=True)  # [A], assignments grouped by expert
        token = order // self.top_k  # [A], the token of each grouped assignment
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()  # the one host sync
        y = run_experts(self.experts, x[token], counts).to(x.device) * weights.reshape(-1)[order, None]  # [A, C]
        return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))  # weighted in the routing's dtype


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
