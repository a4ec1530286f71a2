"""Weights in memory of their own: transformers loads safetensors weights as views of the memory-mapped file, so a
shard truncated or rewritten in place while the model runs (a copy over it, a sync tool, a second conversion
without the atomic swap) would kill the interpreter with SIGBUS at the next matmul, or silently change the
weights. Copying them out at load costs one memcpy of the weights and makes their pages private to the process
(no longer shared through the page cache with other processes loading the same files)."""

from torch import nn


def own_file_backed_tensors(model: nn.Module) -> int:
    """Copies every CPU parameter and buffer that is a view of a mapped file into memory of its own (tied weights
    stay tied: they are one Parameter); returns the bytes copied."""
    copied = 0
    tensors = [*model.parameters(), *model.buffers()]
    for tensor in tensors:
        if tensor.device.type != "cpu" or tensor.untyped_storage().resizable():
            continue  # allocated by torch (resizable), or on an accelerator: not backed by a file
        tensor.data = tensor.data.clone()
        copied += tensor.numel() * tensor.element_size()
    return copied
