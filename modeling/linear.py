"""`nn.Linear` whose inference on CPU runs oneDNN's matmul instead of aten's.

On the 2-core AMD EPYC this project is measured on, aten's fp32 `addmm` (MKL sgemm) reaches about 220 GFLOP/s on
the shapes of these models, oneDNN's matmul primitive (the op inductor uses for linears when it freezes weights)
about 490; for one row per sequence, as in decoding, oneDNN streams the weight at about 40 GB/s where aten's reaches
17-28 (`benchmarks/`). On Intel CPUs aten's fp32 GEMM is MKL's tuned kernel, as fast or faster: there fp32 stays
on aten (`aten_float32_is_mkl_on_intel`), and half precision, which aten also hands to oneDNN, takes the op. The op
takes part in no autograd, tracing or transform machinery, so every call such machinery watches goes through
`F.linear`, as does every case the op does not cover. Results agree with aten's to
fp32 rounding: the sums run in another order. `torch.backends.mkldnn.flags(enabled=False)` turns the path off.

The path reads private torch internals (PRIVATE_SYMBOLS), and this file ships inside every converted checkpoint's
remote code, to run on torch versions fivefold never saw: each internal is looked up by feature, and a torch that
lacks one runs F.linear everywhere, with one warning, never an exception.
"""

import functools
import importlib
import types
import warnings

import torch
from torch import nn
from torch.nn import functional as F
from transformers.activations import GELUActivation, GELUTanh, NewGELUActivation

from .int8 import int8_dynamic_linears, int8_linear, traced_int8_linear, traced_int8_takes


def find_private(path: str) -> object | None:
    """The object at a dotted path under `torch` (importing submodules on the way), or None where this torch has
    none: private internals come and go between releases."""
    found: object = torch
    for part in path.split(".")[1:]:
        step = getattr(found, part, None)
        if step is None and isinstance(found, types.ModuleType):
            try:
                step = importlib.import_module(f"{found.__name__}.{part}")
            except ImportError:
                step = None
        if step is None:
            return None
        found = step
    return found


# The private torch internals the oneDNN path reads: the op itself, and what tells whether machinery that must see
# an aten linear is watching. Each is looked up once, by feature; without any of them every call takes F.linear.
PRIVATE_SYMBOLS = (
    "torch.ops.mkldnn._linear_pointwise",
    "torch.autograd.forward_ad._current_level",
    "torch._C._functorch.peek_interpreter_stack",
    "torch.utils._python_dispatch.is_in_torch_dispatch_mode",
    "torch._C._is_torch_function_mode_enabled",
)


def find_private_symbols() -> tuple[dict[str, object], tuple[str, ...]]:
    """({path: object} for those this torch has, the paths of those it lacks)."""
    found = {path: find_private(path) for path in PRIVATE_SYMBOLS}
    return {p: v for p, v in found.items() if v is not None}, tuple(p for p, v in found.items() if v is None)


_PRIVATE, MISSING_PRIVATE = find_private_symbols()
_ONEDNN_LINEAR = _PRIVATE.get("torch.ops.mkldnn._linear_pointwise")
ONEDNN_AVAILABLE = not MISSING_PRIVATE and torch.backends.mkldnn.is_available()

# Half-precision matmuls run through oneDNN where this CPU has the instructions for them (avx512_bf16 or AMX for
# bf16, avx512_fp16 or AMX-FP16 for fp16), asked at run time; elsewhere aten's path, whose bf16 GEMM oneDNN also
# backs, is as good. A torch without the probe keeps that dtype on F.linear.
_HALF_PROBES = {
    torch.bfloat16: "torch.ops.mkldnn._is_mkldnn_bf16_supported",
    torch.float16: "torch.ops.mkldnn._is_mkldnn_fp16_supported",
}


def onednn_dtypes() -> frozenset[torch.dtype]:
    """The dtypes oneDNN's matmul takes here: fp32, and bf16 / fp16 where the CPU supports them."""
    if not ONEDNN_AVAILABLE:
        return frozenset()
    probes = {dtype: find_private(path) for dtype, path in _HALF_PROBES.items()}
    return frozenset({torch.float32} | {dtype for dtype, probe in probes.items() if probe is not None and probe()})


def cpu_vendor() -> str:
    """The CPU's vendor string as Linux reports it ("GenuineIntel", "AuthenticAMD"), "" where it can't tell."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), "")
    except OSError:
        return ""


def aten_float32_is_mkl_on_intel() -> bool:
    """Whether aten's fp32 GEMM is MKL on an Intel CPU, where MKL runs its own tuned kernels and oneDNN's matmul is
    no faster (a Xeon with AMX, 2 threads: one row 1536 -> 576 0.08 ms on aten, 0.42 on oneDNN; 1024 rows 768 ->
    3072 25 vs 34 ms). On AMD CPUs MKL takes a generic path, which oneDNN's beats (module docstring)."""
    return torch.backends.mkl.is_available() and cpu_vendor() == "GenuineIntel"


# What the op takes here; and what it runs because it is faster than aten's path (fp32 stays on aten on Intel).
ONEDNN_CAPABLE = onednn_dtypes()
ONEDNN_DTYPES = ONEDNN_CAPABLE - ({torch.float32} if aten_float32_is_mkl_on_intel() else set())
_warned_missing = False


def warn_missing_once(missing: tuple[str, ...]) -> None:
    """One warning per process that the oneDNN path is off, naming what this torch lacks."""
    global _warned_missing
    if missing and not _warned_missing and torch.backends.mkldnn.is_available():
        _warned_missing = True
        warnings.warn(
            f"fivefold's oneDNN linear is off: this torch ({torch.__version__}) lacks {', '.join(missing)}; every "
            "linear runs F.linear (same results, aten's speed)",
            RuntimeWarning,
            stacklevel=3,
        )


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
        or torch.autograd.forward_ad._current_level >= 0
        or _PRIVATE["torch._C._functorch.peek_interpreter_stack"]() is not None
        or _PRIVATE["torch.utils._python_dispatch.is_in_torch_dispatch_mode"]()
        or _PRIVATE["torch._C._is_torch_function_mode_enabled"]()
    )


def uses_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `linear` takes oneDNN's path for these tensors."""
    if not ONEDNN_AVAILABLE:
        warn_missing_once(MISSING_PRIVATE)
        return False
    if not (type(x) in _PLAIN and type(weight) in _PLAIN) or _watched():
        return False  # first, so that no FX proxy or traced tensor reaches a data-dependent check
    # `is_cpu` rather than `.device.type == "cpu"`: the same answer at a sixth of the cost, on every linear of every
    # decoding step.
    if bias is not None and not (
        type(bias) in _PLAIN and bias.is_cpu and bias.dtype in (torch.float32, x.dtype) and bias.is_contiguous()
    ):
        return False  # the op reads the bias as a dense vector in host memory
    return (
        x.is_cpu
        and weight.is_cpu
        and x.dtype in ONEDNN_DTYPES
        and weight.dtype == x.dtype
        and x.layout == torch.strided
        and weight.layout == torch.strided
        and x.dim() >= 2
        and torch.backends.mkldnn.enabled
        and (weight.numel() >= ONEDNN_MIN_WEIGHT or x.numel() * weight.shape[0] >= ONEDNN_MIN_WORK)
        and not (
            torch.is_grad_enabled()
            and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
        )
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN where `uses_onednn` allows, or through torch's int8 kernel for
    a quantizer's int8 weight where int8.py allows."""
    if uses_onednn(x, weight, bias):
        return _ONEDNN_LINEAR(x, weight, bias, "none", [], "")
    # A tensor subclass's weight on plain activations (an FX proxy is neither).
    quantized = type(x) in _PLAIN and type(weight) not in _PLAIN and isinstance(weight, torch.Tensor)
    if not MISSING_PRIVATE and quantized and not (torch.is_grad_enabled() and x.requires_grad):
        if not _watched():
            y = int8_linear(x, weight, bias)
        else:  # dynamo sees torchao's int8 product as the op its int8 GEMM lowers; other tracers, torchao's own op
            y = traced_int8_linear(x, weight, bias) if torch.compiler.is_dynamo_compiling() else None
        if y is not None:
            return y
    return F.linear(x, weight, bias)


def traces_to_plain_tensors(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear(x, weight)` puts only plain tensors into a torch.compile graph: a plain weight, or a
    quantizer's int8 weight that the traced int8 product reads as its int8 data and scales."""
    return type(weight) in _PLAIN or (not MISSING_PRIVATE and traced_int8_takes(x, weight))


class Linear(nn.Linear):
    """A drop-in `nn.Linear` (same parameters, names and checkpoint layout) running `linear` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def linears_on_one_input(x: torch.Tensor, *layers: nn.Module) -> list[torch.Tensor]:
    """`[layer(x) for layer in layers]`. Where every layer is a plain fivefold `Linear` with a dynamic int8 weight
    and nothing intercepts them, x is quantized once for all: the same results, and MiniLM's int8 query, key and
    value projections spend a third of the time around their products."""
    shared = (
        len(layers) > 1
        and not MISSING_PRIVATE
        and type(x) in _PLAIN
        and all(
            type(layer) is Linear and type(layer.weight) not in _PLAIN and not intercepted(layer) for layer in layers
        )
        and not _watched()
    )
    found = int8_dynamic_linears(x, [(layer.weight, layer.bias) for layer in layers]) if shared else None
    return found if found is not None else [layer(x) for layer in layers]


# Activations oneDNN applies to the matmul's output before writing it (a post-op): (attr, scalars, algorithm).
# The activation then reads the fp32 accumulator, where a separate one reads the rounded output, and the [N, F]
# inner activations make one trip through memory instead of three (bf16 elementwise ops in aten are slow besides).
FUSED_ACTIVATIONS: dict[type, tuple[str, list, str]] = {
    GELUActivation: ("gelu", [], "none"),
    NewGELUActivation: ("gelu", [], "tanh"),
    GELUTanh: ("gelu", [], "tanh"),
    nn.ReLU: ("relu", [], ""),
}


def intercepted(layer: nn.Module) -> bool:
    """Whether something other than `Linear.forward` may run on a call of `layer` (hooks, a patched forward)."""
    return bool(
        layer._forward_hooks
        or layer._forward_pre_hooks
        or "forward" in vars(layer)
        or getattr(layer, "_compiled_call_impl", None) is not None  # `module.compile()`
        or nn.modules.module._global_forward_hooks
        or nn.modules.module._global_forward_pre_hooks
    )


def linear_then_activation(layer: nn.Module, activation: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`activation(layer(x))`, as one oneDNN matmul with the activation as its post-op where the layer is a plain
    fivefold `Linear` and nothing intercepts either module (not a LoRA wrapper, no hooks) and the op takes these
    tensors. Where the op does not (an int8 weight, a layer too small for oneDNN), an activation whose forward is
    one aten op runs in place on the layer's output outside autograd: that output is the layer's own fresh tensor,
    and a second [N, F] buffer costs its page faults (a ragged MiniLM batch's int8 GELUs spent 53 ms a forward in
    them, Zen 4)."""
    fused = FUSED_ACTIVATIONS.get(type(activation))
    if fused is None or type(layer) is not Linear or intercepted(layer) or intercepted(activation):
        return activation(layer(x))
    if uses_onednn(x, layer.weight, layer.bias):
        return _ONEDNN_LINEAR(x, layer.weight, layer.bias, *fused)
    y = layer(x)
    in_place = _in_place(activation)
    if in_place is None or MISSING_PRIVATE or type(y) not in _PLAIN or y.requires_grad or _watched():
        return activation(y)
    return in_place(y)


def _in_place(activation: nn.Module):
    """The activation as the aten op that overwrites its input, where its forward is exactly that op; None where
    it is a Python formula (`gelu_new`, the `use_*_python` variants), whose roundings differ from the op's."""
    act = getattr(activation, "act", None)
    if type(activation) is nn.ReLU:
        return torch.relu_
    if type(activation) is GELUActivation and act is F.gelu:
        return torch.ops.aten.gelu_
    tanh = isinstance(act, functools.partial) and act.func is F.gelu and not act.args
    if type(activation) is GELUTanh and tanh and act.keywords == {"approximate": "tanh"}:
        return functools.partial(torch.ops.aten.gelu_, approximate="tanh")
    return None


def use_torch_linears(model: nn.Module) -> nn.Module:
    """Turns every fivefold `Linear` in `model` into a `torch.nn.Linear`, in place: the same parameters, names and
    hooks, without the oneDNN path. For tools that match modules by exact type, such as
    `torch.ao.quantization.quantize_dynamic`. Returns `model`."""
    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = nn.Linear  # Linear adds no state: only the forward changes
    return model
