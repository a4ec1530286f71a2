"""The registry of feed-forward kinds a block can hold, by name: it imports every kind (the dense and gated
networks, and the mixture of experts built from gated ones), so that none of them imports another's registry."""

from torch import nn

from .feedforward import DenseFeedForward, FeedForwardSpec, GatedFeedForward
from .moe import MixtureOfExperts, MoESpec

FEEDFORWARDS: dict[str, type[nn.Module]] = {
    "dense": DenseFeedForward,
    "gated": GatedFeedForward,
    "moe": MixtureOfExperts,
}


def build_feedforward(spec: FeedForwardSpec | MoESpec) -> nn.Module:
    if spec.kind not in FEEDFORWARDS:
        raise ValueError(f"unknown feed-forward {spec.kind!r}; valid: {', '.join(sorted(FEEDFORWARDS))}")
    return FEEDFORWARDS[spec.kind](spec)
