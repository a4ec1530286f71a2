"""Which cached expert a MoE layer gives up when another must come in: the eviction policies of the expert cache
(expert_cache.py), chosen by `config.expert_cache_eviction`.

"lru": the least recently used. Right when consecutive tokens choose the same experts; wrong when popularity is
skewed and stable (trained MoEs: a few experts take most tokens), since every pass of a rarely used expert pushes a
popular one out. "frequency": the one the layer used least often lately (each expert's count of calls, halved every
`half_life` calls of its layer, so that a change of popularity is followed), the least recently used first among
equal counts; and an expert read for a call stays only if it was used at least as often lately as the one it would
push out, so that a rare expert passes through without evicting a popular one.
"""


class RecencyEviction:
    name = "lru"

    def used(self, layer: str, index: int) -> None:
        pass

    def victim(self, layer: str, candidates: list[int]) -> int:
        """`candidates` least recently used first."""
        return candidates[0]

    def admits(self, layer: str, index: int, victim: int) -> bool:
        return True


class FrequencyEviction:
    name = "frequency"

    def __init__(self, half_life: int = 256):
        self.decay = 0.5 ** (1 / half_life)
        self.clock: dict[str, int] = {}  # calls of each layer so far
        self.counts: dict[tuple[str, int], tuple[float, int]] = {}  # (count, the layer's clock at its last use)

    def score(self, layer: str, index: int) -> float:
        count, when = self.counts.get((layer, index), (0.0, 0))
        return count * self.decay ** (self.clock.get(layer, 0) - when)

    def used(self, layer: str, index: int) -> None:
        now = self.clock[layer] = self.clock.get(layer, 0) + 1
        self.counts[(layer, index)] = (self.score(layer, index) * self.decay + 1.0, now)

    def victim(self, layer: str, candidates: list[int]) -> int:
        return min(candidates, key=lambda index: self.score(layer, index))  # min keeps the first of equals

    def admits(self, layer: str, index: int, victim: int) -> bool:
        return self.score(layer, index) >= self.score(layer, victim)


EVICTIONS = {policy.name: policy for policy in (RecencyEviction, FrequencyEviction)}


def eviction_named(name: str):
    if name not in EVICTIONS:
        raise ValueError(f"expert_cache_eviction={name!r} is not a policy fivefold has: {', '.join(EVICTIONS)}")
    return EVICTIONS[name]()
