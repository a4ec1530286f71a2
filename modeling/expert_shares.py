"""How the expert cache's byte budget is shared among the MoE layers (expert_cache.py says why per layer)."""

from typing import Protocol


class SizedExpert(Protocol):
    """What the shares read of an expert (offloaded_expert.OffloadedExpert)."""

    layer: str
    nbytes: int
    materialized: bool


def count_at_largest(experts: list[SizedExpert]) -> None:
    """Counts each layer's experts at its largest one's bytes: experts of one shape may store a few bytes of state
    more or less (double quantization's offset), and a share sized to the bytes placed would then evict two experts
    to admit one."""
    largest: dict[str, int] = {}
    for expert in experts:
        largest[expert.layer] = max(largest.get(expert.layer, 0), expert.nbytes)
    for expert in experts:
        expert.nbytes = largest[expert.layer]


def layer_shares(experts: list[SizedExpert], layers: list[str], budget: int) -> dict[str, int]:
    """Each layer's share of the budget, in proportion to its experts' bytes; where the budget holds every expert the
    device map placed on the device, each layer's share holds its own (a map may place more experts of one layer than
    of another, and a share in proportion alone would evict one at load)."""
    total = {layer: sum(e.nbytes for e in experts if e.layer == layer) for layer in layers}
    placed = {layer: sum(e.nbytes for e in experts if e.layer == layer and e.materialized) for layer in layers}
    rest, unplaced = budget - sum(placed.values()), sum(total.values()) - sum(placed.values())
    if rest < 0 or not any(placed.values()):
        everything = sum(total.values())
        return {layer: budget * size // everything if everything else 0 for layer, size in total.items()}
    return {
        layer: placed[layer] + (rest * (total[layer] - placed[layer]) // unplaced if unplaced else 0)
        for layer in layers
    }
