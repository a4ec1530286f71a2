"""`nn.Linear` whose inference on CPU runs oneDNN's matmul instead of aten's.

On the 2-core AMD EPYC this project is measured on, aten's fp32 `addmm` (MKL sgemm) reaches about 220 GFLOP/s on
the shapes of these models, oneDNN's matmul primitive (the kernel torch.compile's CPU backend emits for linears)
about 490; for one row per sequence, as in decoding, oneDNN streams the weight at about 40 GB/s where aten's reaches
17-28 (`benchmarks/`). The oneDNN op has no backward, so any call autograd must record goes through `F.linear`, as
does every case the op does not cover. Results agree with aten's to fp32 rounding: the sums run in another order.
`torch.backends.mkldnn.flags(enabled=False)` turns the fast path off.
"""

import torch
from torch import nn
from torch.nn import functional as F

_ONEDNN_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
ONEDNN_AVAILABLE = _ONEDNN_LINEAR is not None and torch.backends.mkldnn.is_available()

# oneDNN costs ~10 us more per call than aten. It pays off from this many multiply-adds (rows x in x out), or from
# this many weights whatever the rows: a weight that large is read from memory, not cache, in a real model, and
# oneDNN streams it faster (256 x 256 at one row: 20 us vs 23; 768 x 768: 84 vs 137).
ONEDNN_MIN_WORK = 1 << 20
ONEDNN_MIN_WEIGHT = 1 << 16

_PLAIN = (torch.Tensor, nn.Parameter)  # not a DTensor, FakeTensor or quantised wrapper: those keep F.linear


def uses_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `linear` takes oneDNN's path for these tensors."""
    return (
        ONEDNN_AVAILABLE
        and torch.backends.mkldnn.enabled
        and not torch.compiler.is_compiling()  # inductor lowers linears itself (and cannot lower this op unpacked)
        and not torch.is_autocast_enabled("cpu")  # autocast casts F.linear's inputs; it does not know this op
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and type(x) in _PLAIN
        and type(weight) in _PLAIN
        and x.layout == torch.strided
        and weight.layout == torch.strided
        and x.dim() >= 2
        and (weight.numel() >= ONEDNN_MIN_WEIGHT or x.numel() * weight.shape[0] >= ONEDNN_MIN_WORK)
        and (bias is None or (type(bias) in _PLAIN and bias.dtype == torch.float32))
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
