"""The traced int8 product where its weights are operands of a graph rather than constants of it.

Under torch.compile with freezing, a linear's weights become constants of the graph, and with max-autotune inductor
lowers the int8 product (`_weight_int8pack_mm`) to an int8 GEMM it generates for that constant weight. A `torch.cond`
branch (a compiled mixture runs each expert behind one, modeling/expert_paths.py) takes its weights as operands instead,
and there inductor has no GEMM of its own: the aten kernel runs, bound by its arithmetic (one row: 12-19 GB/s of int8
weights; 32 rows: 1.8 ms for a 3584 x 1024 weight, Zen 4, 2 threads). Inside `weights_as_operands()` the traced int8
product is written so that inductor makes something faster of it:

- one row, a reduction over the channels, `(x * w).sum(-1)`, which inductor generates as one vectorised kernel
  reading the int8 weight once (22-28 GB/s);
- from 8 rows, the weight converted to bf16 and multiplied by aten's bf16 GEMM (32 rows: 1.0 ms);
- between, the aten kernel still: a 3584 x 1024 weight compiled as a graph input, 2 rows 0.28 ms (the reduction
  0.35, the bf16 GEMM 0.46), 4 rows 0.37 (0.72, 0.54), 8 rows 0.73 (1.45, 0.72).

That holds where AVX-512 vectorises the reduction and the bf16 GEMM. On an AVX2-only CPU the aten kernel is the
fastest at every row count (Zen 3, 2 threads, that weight: one row 0.43 ms, the reduction about 1.0; 32 rows 3.5
ms, the bf16 GEMM 15.3), so there it runs throughout (`REWRITTEN`).

Shapes: N tokens, C channels (the input features), O head outputs (the output features).
"""

import torch

from .tracing import TraceSwitch

# Set around `torch.cond` in traced code and read while dynamo traces the branch.
_OPERANDS = TraceSwitch()
# Inside, traced int8 products take their weights as operands (a `torch.cond` branch's).
weights_as_operands = _OPERANDS.on


def operand_weights() -> bool:
    """Whether the traced code being run takes its weights as operands (inside `weights_as_operands()`)."""
    return _OPERANDS.is_on()


_GEMM_ROWS = 8
REWRITTEN = torch.backends.cpu.get_cpu_capability() not in ("AVX2", "DEFAULT")


def operand_int8_product(x16: torch.Tensor, qdata: torch.Tensor) -> torch.Tensor | None:
    """x16 [N, C] bf16 @ qdata [O, C] int8 .T -> [N, O] bf16, as the unit-scaled `_weight_int8pack_mm` gives it;
    None where that kernel is the faster (2 to 7 rows, or any on an AVX2-only CPU)."""
    if not REWRITTEN:
        return None
    rows = x16.shape[0]
    if rows == 1:
        return (x16.float() * qdata).sum(-1, keepdim=True).T.to(torch.bfloat16)
    if rows >= _GEMM_ROWS:
        return x16 @ qdata.to(torch.bfloat16).T
    return None
