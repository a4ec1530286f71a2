"""One-row int8 products: the rate at which each kernel fivefold's int8 decoding can run reads its weights.

A decoding step at batch 1 multiplies one row by every weight, so its time is the weights' bytes over the rate at
which the product's kernel reads them. This measures that rate for the kernels fivefold's paths use, over distinct
weights of the reduced Mixtral expert's shape (3,584 x 1,024) that together fill `--gib` (default 1 GiB, beyond the
caches), beside a plain sum over the same bytes (the read bandwidth `benchmarks/quantized.py` divides by):

- fp32 linear: `F.linear` on fp32 weights of the same bytes (896 x 1,024 each), eager fp32 decoding's product;
- aten int8: `_weight_int8pack_mm`, eager int8 decoding's product (modeling/int8.py), and a compiled mixture's
  expert between 2 and 7 rows;
- inductor reduction: `(x * w).sum(-1)` compiled with the weights as graph inputs, a compiled mixture's expert
  at one row (each expert sits in a `torch.cond` branch, which takes its weights as operands:
  modeling/operand_weights.py);
- inductor int8 GEMM: `_weight_int8pack_mm` compiled with freezing and max-autotune (inductor's own GEMM on
  constant weights), every other compiled int8 product at one row.

`--rows` measures instead where eager int8 leaves the kernel: products of 1 to 512 rows through the aten int8
kernel and through torchao's own path (the int8 weight converted to fp32, aten's GEMM, then the scales), per
weight, on GPT-2's 768 x 768, the expert's shape and a SmolLM2-sized up projection (what
`fivefold.modeling.int8.INT8PACK_MIN_ROWS` and `INT8PACK_WEIGHTS_A_ROW` were chosen from).

    python benchmarks/int8_rows.py --threads 2
    python benchmarks/int8_rows.py --threads 2 --rows
    python benchmarks/int8_rows.py --quick        # 4 weights, seconds: a smoke test
"""

import torch
from harness import alternate, command_line, machine_line, parse, table, write_report

OUT, IN = 3584, 1024


class Products(torch.nn.Module):
    """One row times each of `weights` through `product`, which the module passes the weights to."""

    def __init__(self, weights: list[torch.Tensor], product) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(w, requires_grad=False) for w in weights)
        self.product = product

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.product(x, w) for w in self.weights]


def aten_int8(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int8pack_mm(x, w, torch.ones(w.shape[0], dtype=x.dtype))


def reduction(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.float() * w).sum(-1, keepdim=True).T.to(x.dtype)


def torchao_path(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, w.t().to(x.dtype)) * scale  # torchao's weight-only product for a per-row Int8Tensor


def many_rows(args) -> list[str]:
    """Per product, ms: the aten int8 kernel against torchao's own path, by rows, over weights beyond the caches."""
    shapes = [(768, 768, 96), (OUT, IN, 16), (8192, 2048, 4)]  # (out, in, how many: 56-67 MB of int8)
    counts = (1, 16, 64, 128) if args.quick else (1, 16, 32, 64, 128, 256, 512)
    out = []
    for rows_out, rows_in, count in shapes:
        count = 2 if args.quick else count
        weights = [torch.randint(-127, 128, (rows_out, rows_in), dtype=torch.int8) for _ in range(count)]
        scale = torch.rand(rows_out) / 100
        for rows in counts:
            x = torch.randn(rows, rows_in)
            calls = {
                "kernel": lambda: [aten_int8(x.bfloat16(), w).float() * scale for w in weights],  # noqa: B023
                "torchao": lambda: [torchao_path(x, w, scale) for w in weights],  # noqa: B023
            }
            with torch.no_grad():
                for call in calls.values():
                    call()
                times = alternate(calls, args.runs)
            kernel, torchao = (times[k].median / count * 1e3 for k in calls)
            out.append(
                [f"{rows_out} x {rows_in}", str(rows), f"{kernel:.3f}", f"{torchao:.3f}", f"{kernel / torchao:.2f}x"]
            )
    header = ["weight", "rows", "aten int8 ms", "torchao's path ms", "int8 / torchao"]
    return [machine_line(f"products by rows, medians of {args.runs}"), "", *table(header, out)]


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--gib", type=float, default=1.0, help="the weights' int8 bytes together, in GiB")
    parser.add_argument("--rows", action="store_true", help="many-row products: the kernel against torchao's path")
    args = parse(parser)
    parts = [one_row(args)] if args.quick or not args.rows else []  # --quick smoke-tests both
    parts += [many_rows(args)] if args.quick or args.rows else []
    write_report([line for part in parts for line in [*part, ""]][:-1], args.out, args.json)


def one_row(args) -> list[str]:
    """GB/s of int8 weights (of fp32 ones for fp32's linear and the sum) read by each kernel at one row."""
    gib = 0.02 if args.quick else args.gib
    count = max(4, int(gib * 2**30 / (OUT * IN)) // 4 * 4)
    int8 = [torch.randint(-127, 128, (OUT, IN), dtype=torch.int8) for _ in range(count)]
    fp32 = [w.view(torch.float32).view(-1, IN) for w in int8]  # the same bytes (a quarter of the rows): the rate
    row16, row32 = torch.randn(1, IN, dtype=torch.bfloat16), torch.randn(1, IN)
    # The weights as the compiled step holds them: graph inputs (a `torch.cond` branch's operands), or constants.
    as_inputs = torch.compile(lambda x, ws: [reduction(x, w) for w in ws], dynamic=False)
    frozen = Products(int8, aten_int8).eval()
    with torch.no_grad(), torch._inductor.config.patch(freezing=True, max_autotune_gemm_backends="CPP"):
        frozen = torch.compile(frozen, dynamic=False, options={"max_autotune": True})
        frozen(row16)
    flat = torch.cat([w.view(-1) for w in int8]).view(torch.float32)
    calls = {
        "plain sum (fp32)": flat.sum,
        "fp32 linear": lambda: [torch.nn.functional.linear(row32, w) for w in fp32],
        "aten int8": lambda: [aten_int8(row16, w) for w in int8],
        "inductor reduction, weights as inputs": lambda: as_inputs(row16, int8),
        "inductor int8 GEMM, weights frozen": lambda: frozen(row16),
    }
    with torch.no_grad():
        for call in calls.values():
            call()
        times = alternate(calls, args.runs)
    total = count * OUT * IN
    rows = []
    for label, timing in times.items():
        fast, slow = timing.spread
        rows.append([label, f"{total / timing.median / 1e9:.1f}", f"{total / slow / 1e9:.1f}-{total / fast / 1e9:.1f}"])
    lines = [machine_line(f"{count} weights of {OUT} x {IN}, {total / 2**30:.2f} GiB int8, medians of {args.runs}")]
    return [*lines, "", *table(["product (one row)", "GB/s", "spread"], rows)]


if __name__ == "__main__":
    main()
