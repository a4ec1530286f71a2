"""Reads ahead for the expert cache: while a MoE layer runs, the experts the next MoE layer will likely choose are
read in a background thread, so that reading overlaps compute (as Pre-gated MoE and MoE-Infinity do).

The guess is the next layer's router applied to this layer's input: the residual stream changes little from one
layer to the next, so its top-k experts are often those the next layer picks. A wrong guess costs a read and a
place in the cache, never a result: the layer still routes on its own input, and an expert read ahead is used only
if chosen. `model.expert_cache.stats.prefetch_accuracy` says how often the guess was right.

Shapes: B batch, T time, C channels, N tokens (B * T), E experts.
"""

from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import torch
from torch import nn


class ExpertPrefetcher:
    def __init__(self, cache, layers: list[tuple[str, nn.Module]]):
        self.cache = cache
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fivefold-prefetch")
        self.handles = []
        for (_, layer), (next_name, next_layer) in pairwise(layers):
            if next_name in cache.quota:
                hook = self._reader_for(next_name, next_layer)
                self.handles.append(layer.register_forward_pre_hook(hook))

    def _reader_for(self, name: str, layer: nn.Module):
        def read_ahead(module: nn.Module, args: tuple) -> None:
            x = args[0].reshape(-1, args[0].shape[-1])  # [N, C]
            with torch.no_grad():
                logits = layer.router(x)  # [N, E]; accelerate's hooks, if any, place x
                tokens = logits.topk(layer.top_k, dim=-1).indices.flatten().bincount(minlength=logits.shape[-1])
                picked = tokens.argsort(descending=True, stable=True)[: int((tokens > 0).sum())]  # most tokens first
            self.cache.prefetch(name, picked.tolist(), self.pool)

        return read_ahead

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.pool.shutdown(wait=True)
