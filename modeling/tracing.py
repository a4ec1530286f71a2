"""What runs differently while a compiler or exporter traces the model (torch.compile, torch.export,
torch.onnx.export, torch.jit.trace).

A traced graph cannot branch on a tensor's values. Three things in fivefold read them on the host, and each has one
documented behaviour under tracing:

- Input checks (token ids within the vocabulary, positions within the position table, ...): each is a small named
  function decorated with `eager_only`. It always runs in eager and is skipped only while tracing, so a compiled or
  exported model does not raise fivefold's messages; out-of-range ids then fail inside the graph (inductor's
  bounds-checked indexing) or are the exporter's runtime's business. Checks on shapes alone are plain Python and
  run under tracing too.
- Unpadding (a padded batch packed into its real tokens): its sizes depend on the mask's values, so traced graphs
  run the padded layout with the mask, as stock does (kernels.unpads).
- Mask shortcuts (no mask when nothing is padded): traced graphs always carry the mask.

What a graph holds may also depend on who traces it: torch.compile runs its graph itself, so it may take control
flow inside the graph (`torch.cond`, expert_paths.py), where exporters get plain tensor ops (`tracing_for_export`).
"""

import functools
from collections.abc import Callable
from typing import ParamSpec

import torch

P = ParamSpec("P")


# Shipped remote code may meet a torch without it (this file travels in converted folders).
_is_exporting = getattr(torch.compiler, "is_exporting", lambda: False)


def tracing() -> bool:
    """Whether the current call is being traced into a graph rather than run."""
    return torch.compiler.is_compiling() or _is_exporting() or torch.jit.is_tracing()


def tracing_for_export() -> bool:
    """Whether the graph being traced is for an exporter (torch.export, torch.onnx.export, torch.jit.trace) rather
    than for torch.compile to run: such graphs keep to plain tensor ops."""
    return _is_exporting() or torch.jit.is_tracing()


def eager_only(check: Callable[P, None]) -> Callable[P, None]:
    """A check that reads tensor values: run in eager, skipped while tracing (never silently dropped in eager)."""

    @functools.wraps(check)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        if not tracing():
            check(*args, **kwargs)

    return run
