"""Ways to run a mixture-of-experts layer's experts other than its eager dispatch (moe.py), each for one setting.

Under tracing (torch.compile, torch.export) the eager dispatch cannot run: it groups tokens by expert, sizes only the
routing values know. `weighted_experts` runs every expert on every token instead and weights each output by the
token's routing weight for that expert (zero where it was not chosen): no data-dependent shape, E / R times the
multiply-adds. At decoding sizes that is close to the eager cost (every expert is read either way); for compiled
prefill of a wide mixture it is the price of one static graph.

Shapes: N tokens, C channels, E experts, R experts per token.
"""

import torch
from torch import nn


def weighted_experts(
    x: torch.Tensor,  # [N, C]
    weights: torch.Tensor,  # [N, R] fp32
    chosen: torch.Tensor,  # [N, R] expert ids
    experts: nn.ModuleList,
) -> torch.Tensor:  # [N, C]
    """Each token the weighted sum of its experts' outputs, from every expert's output on every token."""
    combine = torch.zeros(x.shape[0], len(experts), dtype=weights.dtype, device=x.device)
    combine = combine.scatter(1, chosen, weights)  # [N, E], fp32 like Mixtral's weighting
    out = torch.zeros_like(x, dtype=combine.dtype)
    for e, expert in enumerate(experts):
        # An expert placed on another device answers there; the tokens are combined where x lives.
        out = out + expert(x).to(x.device) * combine[:, e, None]
    return out.to(x.dtype)
