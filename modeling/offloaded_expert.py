"""One offloaded expert: where its stored tensors are (a checkpoint's file, or CPU memory), how they make its
parameters, and how they are put on its module for a call or while cached, and taken off again (back to meta).
The expert cache (expert_cache.py) decides when."""

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .expert_store import MemoryTensor
from .quantized_experts import held_bytes, leaf_tensors


class OffloadedExpert:
    """One expert whose weights may live off its execution device: its stored tensors' sources, how they make its
    parameters (`assemble`: each parameter its own stored tensor by default; a quantized one may be several, see
    quantized_experts.py), and a way to put them on the module (while cached, or for one call) and take them off
    (back to meta)."""

    def __init__(
        self, module: nn.Module, layer: str, index: int, sources: dict, device: torch.device, assemble=None
    ) -> None:
        self.module, self.layer, self.index, self.device = module, layer, index, torch.device(device)
        self.sources = sources  # {stored tensor name in the module: FileTensor | MemoryTensor}
        self.shapes = {name: (p.shape, p.dtype) for name, p in module.named_parameters()}
        self.assemble = assemble if assemble is not None else AsStored(self.shapes)
        if set(self.assemble.stored_names()) != set(sources):
            missing = sorted(set(self.assemble.stored_names()) - set(sources))
            raise ValueError(f"{layer}.experts.{index}: no source for {missing}")
        self.nbytes = self.assemble.device_bytes(sources)  # on the device
        self.read_bytes = sum(source.nbytes for source in sources.values())  # from disk, per read
        self.flops_per_token = 2 * sum(_logical_numel(p) for p in module.parameters())
        self.owned: dict[str, torch.Tensor] = {}  # read buffers its parameters are views of, while materialized
        self.unrun = False  # materialized, and not called since: a quantizer may still replace its data

    def __repr__(self) -> str:
        return f"OffloadedExpert({self.layer}.experts.{self.index})"

    def read(self, spare: list[dict[str, torch.Tensor]] = ()) -> dict[str, torch.Tensor]:
        """Its parameters in CPU memory (pinned for an accelerator), as the module holds them."""
        return self.typed(self.fill(self.buffers(spare)))

    def buffers(self, spare: list[dict[str, torch.Tensor]] = ()) -> dict[str, torch.Tensor | None]:
        """Room for its stored bytes, allocated in the calling thread (see FileTensor.empty), or taken from `spare`
        (buffers evicted experts gave up) where one is large enough."""
        pin = self.device.type == "cuda" and torch.cuda.is_available()
        room = {}
        for name, source in self.sources.items():
            given = next((b for b in spare if name in b and b[name].numel() >= source.capacity), None)
            room[name] = given.pop(name) if given is not None and not pin else source.empty(pin)
        return room

    def fill(self, buffers: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
        """Its tensors as stored, read into `buffers`; may run in a background thread (it allocates nothing)."""
        return {name: source.read(into=buffers[name]) for name, source in self.sources.items()}

    def typed(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Its parameters, by name, from its stored tensors."""
        return self.assemble(tensors)

    def materialize(
        self, tensors: dict[str, torch.Tensor], device: torch.device, buffers: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Puts the parameters on the module; `buffers`, the stored tensors were read into, are kept for `release`
        to hand on where a parameter (or a quantized parameter's data) is a view of them."""
        held = set()
        for name, tensor in tensors.items():
            parameter = tensor.to(device, non_blocking=True)
            _set_parameter(self.module, name, parameter)
            held |= _storages(parameter)
        self.owned = {n: b for n, b in (buffers or {}).items() if b is not None and b.data_ptr() in held}
        self.unrun = True

    def forget_replaced(self) -> dict[str, torch.Tensor]:
        """Lets go of the read buffers no parameter is a view of any more, and returns them: a quantizer may replace
        a weight's data at its first call (bitsandbytes repacks a 4-bit weight for its CPU kernel), and the buffer
        read would stay held beside the new data, uncounted, while the expert is cached."""
        held = set().union(*(_storages(p) for p in self.module.parameters()))
        replaced = {name: b for name, b in self.owned.items() if b.data_ptr() not in held}
        self.owned = {name: b for name, b in self.owned.items() if name not in replaced}
        return {name: b for name, b in replaced.items() if _held_only_here(b)}

    def release(self) -> dict[str, torch.Tensor]:
        """Back to meta; the read buffers its parameters were views of, free for another expert's read."""
        for name, (shape, dtype) in self.shapes.items():
            _set_parameter(self.module, name, torch.empty(shape, dtype=dtype, device="meta"))
        owned, self.owned = self.owned, {}
        return {name: buffer for name, buffer in owned.items() if _held_only_here(buffer)}

    @property
    def lives_in_memory(self) -> bool:
        """Whether its stored tensors are in CPU memory (placed on "cpu" under an accelerator), not in a file."""
        return all(isinstance(source, MemoryTensor) for source in self.sources.values())

    @property
    def materialized(self) -> bool:
        return next(iter(self.module.parameters())).device.type != "meta"


class AsStored:
    """Each parameter is the stored tensor of its own name, in the parameter's dtype."""

    def __init__(self, shapes: dict[str, tuple[torch.Size, torch.dtype]]) -> None:
        self.shapes = shapes

    def stored_names(self, parameter: str | None = None) -> list[str]:
        """The stored tensors that make `parameter` (every parameter's by default)."""
        return list(self.shapes) if parameter is None else [parameter]

    def device_bytes(self, sources: dict) -> int:
        """Its shape in its dtype; a quantized weight held in memory (an expert on "cpu" under an accelerator), what
        that holds."""
        tensors = {name: getattr(sources[name], "tensor", None) for name in self.shapes}
        return sum(
            held_bytes(tensors[name])
            if is_traceable_wrapper_subclass(tensors[name])
            else shape.numel() * dtype.itemsize
            for name, (shape, dtype) in self.shapes.items()
        )

    def __call__(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: tensor.to(self.shapes[name][1]) for name, tensor in tensors.items()}


def _logical_numel(parameter: torch.Tensor) -> int:
    """The weights a parameter stands for: a bitsandbytes 4-bit weight in memory is packed two a byte, and its
    quantization state knows its shape."""
    state = getattr(parameter, "quant_state", None)
    return state.shape.numel() if state is not None else parameter.numel()


def _storages(tensor: torch.Tensor) -> set[int]:
    """Where a tensor's data lives: its storage, or those of the tensors a quantized weight holds."""
    return {leaf.untyped_storage().data_ptr() for leaf in leaf_tensors(tensor)}


def _held_only_here(buffer: torch.Tensor) -> bool:
    """Whether nothing but `buffer` holds its memory: a weight a user kept a reference to is never overwritten."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return use_count is not None and use_count(buffer.untyped_storage()._cdata) <= 2  # buffer, and the storage asked


def _set_parameter(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    target = module.get_submodule(owner)
    # A parameter class of a quantizer's own (bitsandbytes' Params4bit, with its quantization state) stays as it is.
    target._parameters[leaf] = tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor, requires_grad=False)
