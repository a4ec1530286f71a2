"""`nn.Linear` whose inference on CPU runs oneDNN's matmul instead of aten's.

On the 2-core AMD EPYC this project is measured on, aten's fp32 `addmm` (MKL sgemm) reaches about 220 GFLOP/s on
the shapes of these models, oneDNN's matmul primitive (the op inductor uses for linears when it freezes weights)
about 490; for one row per sequence, as in decoding, oneDNN streams the weight at about 40 GB/s where aten's reaches
17-28 (`benchmarks/`). The op takes part in no autograd, tracing or transform machinery, so every call such
machinery watches goes through `F.linear`, as does every case the op does not cover. Results agree with aten's to
fp32 rounding: the sums run in another order. `torch.backends.mkldnn.flags(enabled=False)` turns the path off.
"""

import torch
from torch import nn
from torch.autograd import forward_ad
from torch.nn import functional as F
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

_ONEDNN_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
ONEDNN_AVAILABLE = _ONEDNN_LINEAR is not None and torch.backends.mkldnn.is_available()

# oneDNN costs ~10 us more per call than aten. It pays off from this many multiply-adds (rows x in x out), or from
# this many weights whatever the rows: a weight that large is read from memory, not cache, in a real model, and
# oneDNN streams it faster (256 x 256 at one row: 20 us vs 23; 768 x 768: 84 vs 137).
ONEDNN_MIN_WORK = 1 << 20
ONEDNN_MIN_WEIGHT = 1 << 16

# Not an FX proxy, DTensor, FakeTensor or quantised wrapper: those keep F.linear.
_PLAIN = (torch.Tensor, nn.Parameter)


def _watched() -> bool:
    """Machinery that must see an aten linear: compilers and tracers, autocast (it casts F.linear's inputs),
    forward-mode AD and torch.func transforms (the op has no derivative), Python dispatch and function modes
    (FLOP counters and the like)."""
    return (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or torch.is_autocast_enabled("cpu")
        or forward_ad._current_level >= 0
        or torch._C._functorch.peek_interpreter_stack() is not None
        or is_in_torch_dispatch_mode()
        or torch._C._is_torch_function_mode_enabled()
    )


def uses_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `linear` takes oneDNN's path for these tensors."""
    if not (ONEDNN_AVAILABLE and type(x) in _PLAIN and type(weight) in _PLAIN) or _watched():
        return False  # first, so that no FX proxy or traced tensor reaches a data-dependent check
    if bias is not None and not (
        type(bias) in _PLAIN and bias.device.type == "cpu" and bias.dtype == torch.float32 and bias.is_contiguous()
    ):
        return False  # the op reads the bias as a dense fp32 vector in host memory
    return (
        torch.backends.mkldnn.enabled
        and x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.layout == torch.strided
        and weight.layout == torch.strided
        and x.dim() >= 2
        and (weight.numel() >= ONEDNN_MIN_WEIGHT or x.numel() * weight.shape[0] >= ONEDNN_MIN_WORK)
        and not (
            torch.is_grad_enabled()
            and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
        )
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN where `uses_onednn` allows."""
    if uses_onednn(x, weight, bias):
        return _ONEDNN_LINEAR(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """A drop-in `nn.Linear` (same parameters, names and checkpoint layout) running `linear` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_torch_linears(model: nn.Module) -> nn.Module:
    """Turns every fivefold `Linear` in `model` into a `torch.nn.Linear`, in place: the same parameters, names and
    hooks, without the oneDNN path. For tools that match modules by exact type, such as
    `torch.ao.quantization.quantize_dynamic`. Returns `model`."""
    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = nn.Linear  # Linear adds no state: only the forward changes
    return model
