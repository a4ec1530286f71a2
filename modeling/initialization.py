"""Role-scaled initialisation: where an architecture's stock draws a fresh weight with a std of its own (T5's
fan-in scales, GPT-2's and ModernBERT's smaller residual outputs, ModernBERT's truncated heads), the module is
marked with a `WeightInit` before the model initialises, and FivefoldPreTrainedModel._init_weights draws it from
that. A mark on the module that holds the weight, not a rule on the layer around it: for code outside the
transformers package, transformers' `_initialize_weights` skips every module that holds no parameter of its own
(an attention, a feed-forward, a block), so `_init_weights` never sees those layers."""

from dataclasses import dataclass

from torch import nn

from .attention import Attention
from .feedforward import DenseFeedForward, GatedFeedForward


@dataclass(frozen=True)
class WeightInit:
    """A normal for a fresh weight (its bias zero)."""

    std: float
    cutoff: float | None = None  # a truncated normal: values beyond +-cutoff * std are redrawn


def with_init(module: nn.Module, weight_init: WeightInit | None) -> nn.Module:
    module.weight_init = weight_init
    return module


def mark_projections(
    model: nn.Module,
    query: WeightInit | None = None,
    key_value: WeightInit | None = None,
    attn_out: WeightInit | None = None,
    mlp_in: WeightInit | None = None,  # gate and up
    mlp_out: WeightInit | None = None,
) -> None:
    """Marks the projections of every attention and dense or gated feed-forward in `model` (None: unmarked)."""
    for module in model.modules():
        if isinstance(module, Attention):
            roles = [(module.q_proj, query), (module.k_proj, key_value), (module.v_proj, key_value)]
            roles.append((module.o_proj, attn_out))
        elif isinstance(module, (DenseFeedForward, GatedFeedForward)):
            roles = [(getattr(module, "gate_proj", None), mlp_in), (module.up_proj, mlp_in)]
            roles.append((module.down_proj, mlp_out))
        else:
            continue
        for proj, weight_init in roles:
            if proj is not None and weight_init is not None:
                with_init(proj, weight_init)
