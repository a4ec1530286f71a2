"""Loading with experts offloaded to "disk" without reading them: the load reads what stays in memory, and the
offloaded tensors are read later, when they run, from the checkpoint's own safetensors files.

transformers 5.24 reads every tensor of the checkpoint at load, the ones its device map sends to "disk" too, and
only then finds most of them in its offload index (already in a safetensors file, used as they are) and drops
what it read. For the reduced Mixtral of benchmarks/offload.py with a quarter of its experts in memory, that is
1.7 GB read from the disk to keep 0.5 GB: a cold load took 1.1-1.3 s where its reads of what stays take 0.3.

Here the tensors that transformers will drop unread are left unread: each is handed to the loader as a zero-stride
stand-in of its shape, in its parameter's dtype (no memory behind it, and nothing for the loader's cast to copy),
which the loader passes to the offload index and forgets.
The stand-ins are made only where that is certain: a tensor the offload index takes as it is from the very file
and key being read, a parameter (or a buffer where buffers are offloaded: the loader sets any other buffer on its
module), on a load without a quantizer and without conversions (`WeightConverter`), which would otherwise compute
on the stand-in and save the result, from local files transformers maps (not on Windows or an hf-mount, where it
reads otherwise). Any other load reads as transformers does.
"""

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

try:  # transformers' own index of offloaded tensors, the one its loader consults
    from transformers.core_model_loading import WeightConverter
    from transformers.integrations.accelerate import accelerate_disk_offload
except ImportError:  # another transformers: every load reads as that release does
    WeightConverter = accelerate_disk_offload = None
try:
    from transformers.modeling_utils import _is_on_hf_mount as _on_hf_mount
except ImportError:

    def _on_hf_mount(path: str) -> bool:
        return False


class _Unread:
    """A safetensors slice that is never read: its tensor stands in for one the offload index holds, in the dtype of
    the parameter it would load (so that the loader's cast to that dtype copies nothing)."""

    def __init__(self, tensor_slice: Any, dtype: torch.dtype) -> None:
        self._slice = tensor_slice
        self._dtype = dtype

    def __getitem__(self, index: Any) -> torch.Tensor:
        if index is not Ellipsis:  # a part of it (a shard): read, as the loader asked
            return self._slice[index]
        return torch.empty((), dtype=self._dtype).expand(tuple(self._slice.get_shape()))

    def __getattr__(self, name: str) -> Any:  # get_shape, get_dtype: what the loader asks of a slice
        return getattr(self._slice, name)


def skips_offloaded_reads(state_dict: dict | None, checkpoint_files: list[str] | None, load_config: Any) -> bool:
    """A load from safetensors files that offloads to "disk", with nothing that computes on what it reads."""
    device_map = load_config.device_map or {}
    return (
        accelerate_disk_offload is not None
        and sys.platform != "win32"  # transformers reads with `pread` there, and whole files on an hf-mount
        and not any(_on_hf_mount(str(f)) for f in checkpoint_files or ())
        and not any(str(d).startswith("mps") for d in device_map.values())
        and state_dict is None
        and load_config.hf_quantizer is None
        and not load_config.disable_mmap
        and bool(checkpoint_files)
        and all(str(f).endswith(".safetensors") for f in checkpoint_files)
        and "disk" in device_map.values()
        and not any(isinstance(entry, WeightConverter) for entry in load_config.weight_mapping or ())
    )


def _offloaded_as_stored(model: torch.nn.Module, checkpoint_files: list[str], load_config: Any) -> dict:
    """{(file, key): dtype} of each checkpoint tensor the loader will leave in its file: in transformers' own offload
    index (taken as stored), and a parameter, or a buffer where buffers are offloaded too (the loader sets any other
    buffer on its module, offload index or not)."""
    index = accelerate_disk_offload(
        model, None, checkpoint_files, load_config.device_map, load_config.sharded_metadata, load_config.weight_mapping
    )
    buffers = set() if load_config.offload_buffers else {name for name, _ in model.named_buffers()}
    return {
        (Path(entry["safetensors_file"]).resolve(), entry["weight_name"]): getattr(torch, entry["dtype"])
        for target, entry in index.items()
        if target not in buffers and isinstance(getattr(torch, entry["dtype"], None), torch.dtype)
    }


@contextmanager
def read_without_offloaded(
    model: torch.nn.Module, checkpoint_files: list[str], load_config: Any
) -> Iterator[dict[str, Any]]:
    """The state dict of `checkpoint_files` as lazy slices, those offloaded as stored never read; open for the
    block."""
    unread = _offloaded_as_stored(model, checkpoint_files, load_config)
    with ExitStack() as stack:
        state_dict = {}
        for file in checkpoint_files:
            shard = stack.enter_context(safe_open(file, framework="pt"))
            resolved = Path(file).resolve()
            for key in shard.keys():
                tensor_slice = shard.get_slice(key)
                dtype = unread.get((resolved, key))
                offloaded = dtype is not None and len(tensor_slice.get_shape()) > 0
                state_dict[key] = _Unread(tensor_slice, dtype) if offloaded else tensor_slice
        yield state_dict
