"""The expert cache: the offloaded experts a mixture-of-experts model ran most recently, kept on their execution
device under one byte budget for the whole model.

The budget is split among the MoE layers in proportion to their experts' bytes, and each layer evicts its own least
recently used expert. One model-wide LRU would be the wrong order: layers run in turn, so the entry used longest
ago is always one of the layer about to run, and a model-wide LRU evicts exactly what is needed next. Within one
layer, consecutive tokens choosing the same experts (and popular experts) are what the LRU keeps.

A hit costs nothing: the expert's parameters stay on the device while it is cached. A miss reads only that
expert's tensors (from the checkpoint or CPU memory), evicting older ones of its layer until it fits, and on the
CPU (the execution device) reads them into the buffers of the experts it evicted (a layer's experts have the same
sizes; an accelerator's pinned buffers are not reused): fresh pages cost a page fault and a zeroing each, about 9
ms per 44 MB expert. An expert larger than its layer's share (a budget of 0 turns the cache off) is read for the
call and dropped after it. Bytes read ahead by the prefetcher (prefetch.py) are reserved in the budget while they
wait. (No shapes: whole tensors are moved here; one expert's own bookkeeping is offloaded_expert.py's.)
"""

from collections import OrderedDict
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import torch

from .expert_eviction import RecencyEviction
from .expert_placement import DeviceCosts, compute_on_cpu
from .expert_shares import count_at_largest, layer_shares
from .offloaded_expert import OffloadedExpert
from .owned_memory import freed_heap_bytes, return_freed_memory

# How much freed heap the cache lets glibc keep after a quantizer's repack before it has glibc give it back.
KEPT_FREED_BYTES = 64 << 20


@dataclass
class CacheStats:
    """What the cache did since it was built (or `reset_stats()`): `model.expert_cache.stats`."""

    hits: int = 0  # expert calls whose weights were on the device already
    misses: int = 0  # expert calls that had to read their weights
    bytes_read: int = 0  # from safetensors files, by misses and by the prefetcher
    evictions: int = 0
    prefetched: int = 0  # experts read ahead for the next layer
    prefetch_used: int = 0  # of those, how many that layer then ran
    cpu_calls: int = 0  # calls computed on the CPU where the expert's weights live, instead of moved

    @property
    def hit_rate(self) -> float:
        calls = self.hits + self.misses
        return self.hits / calls if calls else 0.0

    @property
    def prefetch_accuracy(self) -> float:
        return self.prefetch_used / self.prefetched if self.prefetched else 0.0


class ExpertCache:
    def __init__(self, experts: list[OffloadedExpert], budget: int, costs: DeviceCosts | None = None, eviction=None):
        self.budget = budget
        self.eviction = eviction or RecencyEviction()
        self.costs = costs or DeviceCosts()
        self.stats = CacheStats()
        self.experts = {(e.layer, e.index): e for e in experts}
        self.layers = list(dict.fromkeys(e.layer for e in experts))  # in the order the model runs them
        count_at_largest(experts)
        self.quota = layer_shares(experts, self.layers, budget)
        self.cached: dict[str, OrderedDict[int, OffloadedExpert]] = {layer: OrderedDict() for layer in self.layers}
        self.used = dict.fromkeys(self.layers, 0)  # bytes on the device: cached plus reserved for reads ahead
        self.staged: dict[OffloadedExpert, Future] = {}
        self.staged_buffers: dict[OffloadedExpert, dict] = {}  # what each read ahead fills
        self.transient: set[OffloadedExpert] = set()  # materialized for one call only
        self.replaced: dict[str, dict[str, torch.Tensor]] = {}  # per layer, read buffers a quantizer's repack freed
        self.prefetcher = None  # an ExpertPrefetcher, with config.expert_prefetch
        for expert in experts:  # those a device map placed on the device start cached, oldest first
            if expert.materialized:
                self._insert(expert)
                self._room_for(expert.layer, 0)

    def reset_stats(self) -> None:
        self.stats = CacheStats()

    @property
    def bytes_cached(self) -> int:
        return sum(self.used.values())

    def cached_experts(self, layer: str) -> list[int]:
        """The indices of a layer's cached experts, least recently used first."""
        return list(self.cached[layer])

    # --- a call of an expert ------------------------------------------------------------------------------------

    def acquire(self, expert: OffloadedExpert, tokens: int) -> torch.device:
        """Puts the expert's weights where it will run for `tokens` rows; the device it runs on."""
        self._drop_interrupted()
        lru = self.cached[expert.layer]
        self.eviction.used(expert.layer, expert.index)
        if expert.index in lru:
            lru.move_to_end(expert.index)
            self.stats.hits += 1
            return expert.device
        self.stats.misses += 1
        # What a miss allocates is kept past this call: under `torch.inference_mode` (pipelines) it would be inference
        # tensors, which a later call with autograd on cannot use.
        with torch.inference_mode(False), torch.no_grad():
            return self._read_for(expert, tokens)

    def _read_for(self, expert: OffloadedExpert, tokens: int) -> torch.device:
        future = self.staged.pop(expert, None)
        if future is not None:
            buffers = self.staged_buffers.pop(expert)
            self.used[expert.layer] -= expert.nbytes  # the reservation becomes the entry, or is given back
            tensors = expert.typed(future.result())
            self.stats.prefetch_used += 1
            expert.materialize(tensors, expert.device, buffers)
            return self._enter(expert, self._admits(expert) and self._room_for(expert.layer, expert.nbytes))
        # An expert read from disk that the cache keeps is moved: its next calls are hits, where computed on the CPU
        # it would be read from disk again at every call. One in CPU memory runs where it is when that is cheaper.
        cheaper_on_cpu = expert.device.type != "cpu" and compute_on_cpu(
            tokens, expert.nbytes, expert.flops_per_token, self.costs
        )
        # Room first, so that the read goes into what the evicted experts leave.
        spare: list[dict[str, torch.Tensor]] = [self.replaced.pop(expert.layer, {})]
        admitted = not (cheaper_on_cpu and expert.lives_in_memory) and (
            self._admits(expert) and self._room_for(expert.layer, expert.nbytes, spare=spare)
        )
        on_cpu = cheaper_on_cpu and not admitted
        buffers = expert.buffers(spare)
        tensors = expert.typed(expert.fill(buffers))
        self.stats.bytes_read += expert.read_bytes
        if on_cpu:
            expert.materialize(tensors, torch.device("cpu"), buffers)
            self.transient.add(expert)
            self.stats.cpu_calls += 1
            return torch.device("cpu")
        expert.materialize(tensors, expert.device, buffers)
        return self._enter(expert, admitted)

    def _drop_interrupted(self) -> None:
        """Experts run one at a time, each released after its call (`done`): one still held for a single call when
        the next starts was interrupted (an exception in its forward), and goes back to meta now. Left held, it
        would be cached on its next miss while still marked for release, and run as meta after that."""
        while self.transient:
            self.transient.pop().release()

    def _enter(self, expert: OffloadedExpert, admitted: bool) -> torch.device:
        if admitted:
            self._insert(expert)
        else:
            self.transient.add(expert)
        return expert.device

    def done(self, expert: OffloadedExpert) -> None:
        if expert in self.transient:
            self.transient.discard(expert)
            expert.release()
        elif expert.unrun:  # a repack happens at the first call only: later calls skip the walk over its storages
            expert.unrun = False
            # Kept for the layer's next read, one expert's worth at most, rather than freed and allocated again.
            replaced = expert.forget_replaced() if expert.owned else {}
            if replaced:
                self.replaced[expert.layer] = replaced
                # The repack's temporaries (tens of MB a weight) were freed, and glibc keeps such blocks once its
                # mmap threshold has risen: 330-390 MB of heap over a 4-bit decode, which max_memory does not
                # foresee and a memory cgroup counts. Trimmed past a bound: at every repack, the pages given back
                # would be faulted in again, a third of the decoding speed.
                if (freed_heap_bytes() or 0) > KEPT_FREED_BYTES:
                    return_freed_memory()

    # --- reads ahead (prefetch.py) ------------------------------------------------------------------------------

    def prefetch(self, layer: str, indices: list[int], pool: Executor) -> None:
        """Starts reading the given experts of `layer` (the likeliest first) in the background, each in room made in
        its share by evicting only experts not guessed: the guessed ones already cached become the most recent."""
        with torch.inference_mode(False), torch.no_grad():  # buffers kept past this call, as a miss's (acquire)
            self._prefetch(layer, indices, pool)

    def _prefetch(self, layer: str, indices: list[int], pool: Executor) -> None:
        self._settle(layer)
        lru = self.cached[layer]
        for index in indices:
            if index in lru:
                lru.move_to_end(index)
        keep = set(indices)
        for index in indices:
            expert = self.experts.get((layer, index))
            if expert is None or index in lru or expert in self.staged:
                continue
            spare: list[dict[str, torch.Tensor]] = []
            if not self._room_for(layer, expert.nbytes, keep, spare):
                return
            self.used[layer] += expert.nbytes
            self.staged_buffers[expert] = buffers = expert.buffers(spare)
            self.staged[expert] = pool.submit(expert.fill, buffers)
            self.stats.prefetched += 1
            self.stats.bytes_read += expert.read_bytes

    def _settle(self, layer: str) -> None:
        """Reads ahead that the layer did not use become its oldest entries: their bytes are already read."""
        for expert in [e for e in self.staged if e.layer == layer]:
            buffers, future = self.staged_buffers.pop(expert), self.staged.pop(expert)
            try:
                tensors = expert.typed(future.result())
            except BaseException:
                self.used[layer] -= expert.nbytes  # the read failed: its reservation is given back
                raise
            expert.materialize(tensors, expert.device, buffers)
            self.cached[layer][expert.index] = expert
            self.cached[layer].move_to_end(expert.index, last=False)

    # --- bookkeeping --------------------------------------------------------------------------------------------

    def _insert(self, expert: OffloadedExpert) -> None:
        self.cached[expert.layer][expert.index] = expert
        self.used[expert.layer] += expert.nbytes

    def _admits(self, expert: OffloadedExpert) -> bool:
        """Whether the eviction policy keeps this expert, read for a call, at the price of the one it would evict."""
        lru = self.cached[expert.layer]
        if not lru or self.used[expert.layer] + expert.nbytes <= self.quota[expert.layer]:
            return True
        return self.eviction.admits(expert.layer, expert.index, self.eviction.victim(expert.layer, list(lru)))

    def _room_for(self, layer: str, nbytes: int, keep: set[int] = frozenset(), spare: list | None = None) -> bool:
        """Evicts the layer's experts the policy picks (not those in `keep`) until `nbytes` more fit its share;
        whether they do. The evicted experts' read buffers go to `spare`."""
        lru = self.cached[layer]
        while self.used[layer] + nbytes > self.quota[layer]:
            candidates = [index for index in lru if index not in keep]
            if not candidates:
                break
            evicted = lru.pop(self.eviction.victim(layer, candidates))
            freed = evicted.release()
            if spare is not None:
                spare.append(freed)
            self.used[layer] -= evicted.nbytes
            self.stats.evictions += 1
        return self.used[layer] + nbytes <= self.quota[layer]
