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

    python benchmarks/int8_rows.py --threads 2
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


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--gib", type=float, default=1.0, help="the weights' int8 bytes together, in GiB")
    args = parse(parser)
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
    lines += ["", *table(["product (one row)", "GB/s", "spread"], rows)]
    write_report(lines, args.out, args.json)


if __name__ == "__main__":
    main()
