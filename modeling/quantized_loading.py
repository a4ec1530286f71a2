"""Quantizing at load without holding the full-precision model: the memory of a load through a quantizer is the
quantized model plus one full-precision tensor at a time, not the whole full-precision checkpoint.

transformers maps each safetensors shard and keeps the maps open for the whole load, so every page of the
full-precision weights the quantizer reads stays resident in the process until the load ends; and glibc keeps the
full-precision copies the quantizer frees in its arenas, where the next (same-sized) copy rarely lands. Measured on
the reduced Mixtral of benchmarks/quantized.py (1.6 GB of fp32) under torchao int8: 1.7 GB of mapped pages and
2.2 GB of anonymous memory at the peak, for a 0.6 GB int8 model. Read with safetensors' own `pread` backend
instead, the pages go to the page cache (the kernel's to drop, not the process's), and handing freed blocks back
every `TRIM_EVERY_BYTES` read keeps the anonymous memory near what the quantized model has grown to.
"""

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from safetensors import safe_open

from .owned_memory import return_freed_memory

# Freed blocks are handed back once this many bytes have been read since the last time: a trim walks every free
# block of the heap (25 ms each, 127 of them tripled the load of the reduced Mixtral), and the peak grows by at most
# this much.
TRIM_EVERY_BYTES = 128 << 20


class _Reads:
    """The bytes read since freed memory was last handed back."""

    def __init__(self) -> None:
        self.since_trim = 0

    def count(self, nbytes: int) -> None:
        self.since_trim += nbytes
        if self.since_trim >= TRIM_EVERY_BYTES:
            return_freed_memory()
            self.since_trim = 0


class _TrimmingSlice:
    """A safetensors slice whose reads are counted, so that the blocks earlier ones freed go back to the system."""

    def __init__(self, tensor_slice: Any, reads: _Reads) -> None:
        self._slice = tensor_slice
        self._reads = reads

    def __getitem__(self, index: Any) -> Any:
        tensor = self._slice[index]
        self._reads.count(tensor.nbytes)
        return tensor

    def __getattr__(self, name: str) -> Any:  # get_shape, get_dtype: what the loader asks of a slice
        return getattr(self._slice, name)


def reads_one_tensor_at_a_time(state_dict: dict | None, checkpoint_files: list[str] | None, load_config: Any) -> bool:
    """A load that quantizes safetensors shards as it reads them, into memory (no disk offload, whose index reads the
    shards itself), and reads nothing the caller passed in."""
    quantizer = load_config.hf_quantizer
    return (
        state_dict is None
        and quantizer is not None
        and not quantizer.pre_quantized
        and bool(checkpoint_files)
        and all(str(f).endswith(".safetensors") for f in checkpoint_files)
        and "disk" not in (load_config.device_map or {}).values()
    )


@contextmanager
def read_through_pread(checkpoint_files: list[str]) -> Iterator[dict[str, _TrimmingSlice]]:
    """The state dict of `checkpoint_files` as lazy slices read with `pread` (nothing mapped), open for the block."""
    with ExitStack() as stack:
        state_dict, reads = {}, _Reads()
        for file in checkpoint_files:
            shard = stack.enter_context(safe_open(file, framework="pt", backend="pread"))
            state_dict.update({key: _TrimmingSlice(shard.get_slice(key), reads) for key in shard.keys()})
        yield state_dict
