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
And on what the traced call stores: once dynamo has traced a `torch.cond`, it drops some attribute stores made after
it (torch 2.13). On an object the trace created, the next read raises AttributeError and the whole call falls back
to eager, or fails under `fullgraph=True`: a call that creates an object it fills as it goes (a decoder's cache,
made in the forward when none is given) runs `without_branches()`. On a global, the store is not replayed after
the graph runs: transformers' output collector stays set, which `clears_stale_capture` undoes.
"""

import contextlib
import functools
from collections.abc import Callable, Iterator
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


class TraceSwitch:
    """A switch set around traced code and read while dynamo traces the code inside: dynamo sees the value set (and
    writes the final value, off again, back after the graph runs). The value sits in a list held by the switch, so
    that every importer reads the current one."""

    def __init__(self) -> None:
        self._on = [False]

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        before = self._on[0]
        self._on[0] = True
        try:
            yield
        finally:
            self._on[0] = before

    def is_on(self) -> bool:
        return self._on[0]


# Set around a traced call that must not branch (see above).
_NO_BRANCHES = TraceSwitch()
without_branches = _NO_BRANCHES.on


def branches_allowed() -> bool:
    """Whether the call being traced may put `torch.cond` in its graph (outside `without_branches()`)."""
    return not _NO_BRANCHES.is_on()


def clears_stale_capture(forward: Callable[P, object]) -> Callable[P, object]:
    """For a forward decorated with transformers' `capture_outputs` (put above it). Under dynamo, transformers'
    output collector is a global that the forward sets and resets; torch 2.13's dynamo drops attribute stores made
    after a `torch.cond` (a mixture's compiled experts), so a compiled call leaves the collector set, and every later
    eager call would collect its hidden states, attentions and router logits into that stale one and return none.
    An eager call resets it first."""
    from transformers.utils import output_capturing

    @functools.wraps(forward)
    def run(*args: P.args, **kwargs: P.kwargs) -> object:
        collector = output_capturing._active_collector
        if not torch.compiler.is_compiling() and getattr(collector, "compiling", False):
            collector.reset(None)
        return forward(*args, **kwargs)

    return run


def eager_only(check: Callable[P, None]) -> Callable[P, None]:
    """A check that reads tensor values: run in eager, skipped while tracing (never silently dropped in eager)."""

    @functools.wraps(check)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        if not tracing():
            check(*args, **kwargs)

    return run
