"""Weights in memory of their own: transformers loads safetensors weights as views of the memory-mapped file, so a
shard truncated or rewritten in place while the model runs (a copy over it, a sync tool, a second conversion
without the atomic swap) would kill the interpreter with SIGBUS at the next matmul, or silently change the
weights. Copying them out at load costs one memcpy of the weights and makes their pages private to the process
(no longer shared through the page cache with other processes loading the same files), aligned as torch aligns
what it allocates (torch's bf16 int8 kernel needs it: int8.py)."""

import ctypes

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def _file_backed(tensor: torch.Tensor) -> bool:
    """A view of a mapped file: storage torch did not allocate (not resizable). A quantizer's tensor subclass
    (torchao's int8 weights) holds its data in inner tensors, which are asked instead."""
    if is_traceable_wrapper_subclass(tensor):
        return any(_file_backed(inner) for inner in _inner_tensors(tensor))
    return not tensor.untyped_storage().resizable()


def _inner_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    inner = (getattr(tensor, name) for name in tensor.__tensor_flatten__()[0])
    return [t for t in inner if isinstance(t, torch.Tensor)]


def _quantized(tensor: torch.Tensor | None) -> bool:
    """A quantizer's tensor subclass on the CPU; a DTensor's shards are the distributed loaders' to place."""
    return (
        tensor is not None
        and tensor.device.type == "cpu"
        and is_traceable_wrapper_subclass(tensor)
        and not isinstance(tensor, DTensor)
    )


def own_file_backed_tensors(model: nn.Module, only_misaligned: bool = False) -> int:
    """Copies every CPU parameter and buffer that is a view of a mapped file into memory of its own (tied weights
    stay tied); with `only_misaligned`, only the quantized ones and those off a 64-byte boundary. Returns the bytes
    copied. Kernels take other paths on misaligned data: oneDNN sums a one-row product in another order (1e-7 from
    the same weights aligned, and greedy tokens then part), and torch's int8 kernel needs the boundary (int8.py).
    A folder with tensors of odd sizes (bitsandbytes' 78-byte quantization state) misaligns every tensor after
    them, as safetensors aligns to 8 bytes only."""
    copied = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        # (A DTensor answers for its storage as before: the test is the plain tensors' one.)
        if tensor.device.type == "cpu" and not _quantized(tensor) and not tensor.untyped_storage().resizable():
            if only_misaligned and tensor.data_ptr() % 64 == 0:
                continue
            tensor.data = tensor.data.clone()
            copied += tensor.numel() * tensor.element_size()
    # A subclass's `.data` cannot be swapped for its copy: the parameter is replaced where modules hold it.
    replaced: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, tensor in list(module._parameters.items()):
            if not _quantized(tensor):
                continue
            if id(tensor) not in replaced and _file_backed(tensor):
                replaced[id(tensor)] = nn.Parameter(tensor.detach().clone(), requires_grad=tensor.requires_grad)
                copied += sum(inner.nbytes for inner in _inner_tensors(tensor))
            if id(tensor) in replaced:
                module._parameters[name] = replaced[id(tensor)]
    return copied


class _HeapInfo(ctypes.Structure):  # glibc's `struct mallinfo2`
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def freed_heap_bytes() -> int | None:
    """The bytes of freed blocks glibc keeps in its heaps (`mallinfo2`, all arenas; microseconds), or None where the
    C library has no `mallinfo2` (glibc before 2.33, musl, macOS)."""
    info = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if info is None:
        return None
    info.restype = _HeapInfo
    return info().fordblks


def return_freed_memory() -> None:
    """Gives the pages of freed heap blocks back to the system (glibc's `malloc_trim`). Loading through a quantizer
    frees a full-precision copy of every weight it quantizes, and glibc keeps those blocks in the arenas of the
    loader's threads: the reduced Mixtral of benchmarks/quantized.py under torchao int8 held 2.2-2.7 GB of anonymous
    memory after the load, 0.9 GB after the trim (its int8 weights are 0.6 GB). A no-op where the C library has
    no `malloc_trim` (musl, macOS)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the process's own symbols: no library search
    if trim is not None:
        trim(0)
