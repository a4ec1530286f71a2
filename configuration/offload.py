"""The fields every mixture-of-experts config adds for experts bigger than memory (modeling/expert_offload.py).
A dataclass, so that the strict config classes that list it among their bases take its fields as their own."""

from dataclasses import dataclass


@dataclass
class ExpertOffloadFields:
    # The expert cache's budget in bytes (or a size such as "4GB") over the whole model, for experts a device_map
    # offloads; None: what max_memory leaves after the resident parts; 0: no cache (every call reads its expert).
    expert_cache_bytes: int | str | None = None
    # Which cached expert a layer gives up for another (modeling/expert_eviction.py): "lru" or "frequency".
    expert_cache_eviction: str = "lru"
    # Read ahead, in the background, the experts the next MoE layer's router picks on the current hidden state.
    expert_prefetch: bool = False
    # Read offloaded experts past the page cache (O_DIRECT); None: when the cache is on, which then holds them alone.
    expert_direct_reads: bool | None = None
