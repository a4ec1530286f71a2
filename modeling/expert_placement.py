"""Compute where the expert lives: with an accelerator as the execution device, an expert whose weights are in CPU
memory (or just read from disk into it, where the cache would not keep it) may run on the CPU on the few tokens
routed to it, instead of its weights being moved to the accelerator (as Fiddler and llama.cpp's `--n-cpu-moe` do).

The choice is per call: the CPU's time for the call's multiply-adds against the time to move the weights. On a
CPU-only machine the execution device is the CPU and this is never asked.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceCosts:
    """Rates of the machine, to be measured where it matters (`benchmarks/gpu.sh`); set on `model.expert_cache`."""

    cpu_flops: float = 2e11  # floating-point operations a second of the CPU on an expert's matrix products
    transfer_bytes: float = 1.2e10  # bytes a second from pinned CPU memory to the accelerator


def compute_on_cpu(tokens: int, weight_bytes: int, flops_per_token: int, costs: DeviceCosts) -> bool:
    """Whether running `tokens` rows through an expert on the CPU is faster than moving its weights over."""
    return tokens * flops_per_token / costs.cpu_flops < weight_bytes / costs.transfer_bytes
