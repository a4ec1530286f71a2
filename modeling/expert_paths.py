"""How a mixture-of-experts layer runs its experts under tracing, where its eager dispatch (moe.py) cannot.

The eager dispatch groups tokens by expert, sizes only the routing values know. `weighted_experts` runs an expert on
every token of the call and weights each output by the token's routing weight for that expert (zero where it was
not chosen), so no shape depends on the routing. `traced_experts` picks how:

- skipping, for compiled inference on the CPU: each expert behind `torch.cond` on whether any token chose it, so a
  compiled decoding step reads only its tokens' experts (2 of Mixtral's 8 for one sequence) and a prefill that
  touches every expert costs what running all of them costs. The reduced Mixtral's compiled int8 decoding step
  (hidden 1024, 8 experts, top-2): 10.9 ms, where running every expert took 27 (Zen 4, 2 threads); 9.0 with the
  branches' int8 products written for weights that are operands (`weights_as_operands`, operand_weights.py).
- every expert on every token, E / R times the multiply-adds, everywhere else: in training (every expert then gets
  a gradient, a zero one where no token chose it, as the eager dispatch gives it); for exporters and
  `torch.jit.trace` (a graph of plain tensor ops); for experts placed on another device than the tokens or
  offloaded; for experts whose weights enter the graph as a quantizer's tensor subclass (quanto's; torchao's
  other than the int8 weights fivefold multiplies); and in a call that creates its own cache (`without_branches`,
  tracing.py).

Shapes: N tokens, C channels, E experts, R experts per token.
"""

from collections.abc import Callable

import torch
from torch import nn

from .linear import intercepted, traces_to_plain_tensors
from .operand_weights import weights_as_operands
from .tracing import branches_allowed, tracing_for_export

# torch.cond arrived in torch 2.4; shipped remote code may meet an older torch (this file travels in converted folders).
# Measured with torch 2.13 only.
_COND = getattr(torch, "cond", None)


def traced_experts(
    x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, experts: nn.ModuleList
) -> torch.Tensor:
    """x: [N, C], weights/chosen: [N, R] -> [N, C] under tracing, through the path for the setting (above)."""
    # On the CPU only: measured there. On a GPU inductor's `cond` reads each predicate on the host (a sync per
    # expert a step) and gives up CUDA graphs for the whole graph; not measured.
    skip = (
        _COND is not None
        and x.is_cpu
        and not torch.is_grad_enabled()
        and not tracing_for_export()
        and branches_allowed()
        and _plain(x, experts)
    )
    return weighted_experts(x, weights, chosen, experts, skip_unchosen=skip)


def _plain(x: torch.Tensor, experts: nn.ModuleList) -> bool:
    """Whether the experts hold their weights where the tokens are, put only plain tensors into the graph and run
    nothing but their own forwards. A `torch.cond` branch must trace whole (dynamo has no graph break inside one),
    which hooks need not (those that move an expert placed elsewhere or read an offloaded one, with its weights on
    "meta" until then, or a user's); and AOTAutograd has no rule for a tensor subclass (a quantizer's weight) among
    `torch.cond`'s operands (torch 2.13). Such experts stay on the dense path."""
    held = all(t.device == x.device and traces_to_plain_tensors(x, t) for t in experts.parameters())
    return held and not any(intercepted(module) for module in experts.modules())


def weighted_experts(
    x: torch.Tensor,  # [N, C]
    weights: torch.Tensor,  # [N, R] fp32
    chosen: torch.Tensor,  # [N, R] expert ids
    experts: nn.ModuleList,
    skip_unchosen: bool = False,
) -> torch.Tensor:  # [N, C]
    """Each token the weighted sum of its experts' outputs, from each expert's output on every token of the call;
    with `skip_unchosen`, an expert no token chose is skipped inside the graph (`torch.cond`): the same sums."""
    combine = torch.zeros(x.shape[0], len(experts), dtype=weights.dtype, device=x.device)
    combine = combine.scatter(1, chosen, weights)  # [N, E], fp32 like Mixtral's weighting, zero where not chosen
    out = torch.zeros_like(x, dtype=combine.dtype)
    for e, expert in enumerate(experts):
        operands = (x, combine[:, e, None])
        if skip_unchosen:
            with weights_as_operands():
                out = out + _COND(chosen.eq(e).any(), _weighted(expert), _unchosen, operands)
        else:
            out = out + _weighted(expert)(*operands)
    return out.to(x.dtype)


def _weighted(expert: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [N, C], [N, 1] -> [N, C] in weight's dtype
        # An expert placed on another device answers there; the tokens are combined where x lives.
        return expert(x).to(x.device) * weight

    return run


def _unchosen(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x, dtype=torch.promote_types(x.dtype, weight.dtype))  # the dtype `_weighted` returns
