"""Mixtral and its mixture-of-experts layer, fivefold vs stock transformers, on identical weights.

In one run, alternately timed on the same inputs:
- a reduced Mixtral (hidden 1024, expert width 3584, 8 experts, top-2, 4 layers, 16 heads, 8 key/value heads,
  vocab 32000): prefill of 4 x 128 tokens, and greedy generation of 32 tokens from a 32-token prompt;
- the fine-grained MoE layer alone (64 experts, top-8, expert width 256, hidden 512) on 4 x 128 tokens and on
  a decode-sized batch of 4 tokens;
against each of stock's experts implementations (`grouped_mm`, its default, and `eager`). Then the loading
memory: peak RSS (`/usr/bin/time -v`) of a fresh process loading the reduced Mixtral with stock's
`from_pretrained` (its public per-expert checkpoint) and with fivefold's (the converted checkpoint), against
the checkpoint size and the RSS of a process that only imports the libraries.

    python benchmarks/mixtral.py                  # markdown to stdout (about 10 minutes on 2 cores)
    python benchmarks/mixtral.py --quick          # tiny sizes, seconds: a smoke test
    python benchmarks/mixtral.py --runs 7 --out results.md
    python benchmarks/mixtral.py --threads 1 --no-loading   # one thread, less exposed to a busy machine
"""

import argparse
import re
import subprocess
from pathlib import Path

import torch
import transformers
from harness import (
    Checkpoints,
    Timing,
    alternate,
    checkpoints,
    command_line,
    machine_line,
    parse,
    python,
    table,
    timing_results,
    write_report,
)
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

import fivefold
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.experts import copy_stock_moe_block
from fivefold.modeling.moe import MixtureOfExperts, MoESpec

# Not the table's Mixtral-8x7B (47B parameters, 187 GB in fp32, out of reach of a CPU): its vocabulary, 8 experts
# and top-2 routing at a size whose prefill takes about a second.
REDUCED = dict(
    vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_local_experts=8, num_experts_per_tok=2,
    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
)  # fmt: skip
# A fine-grained MoE layer (many small experts), a design no architecture of the table has; and its --quick size.
FINE_GRAINED = dict(hidden_size=512, intermediate_size=256, num_local_experts=64, num_experts_per_tok=8)
QUICK_FINE = dict(hidden_size=64, intermediate_size=32, num_local_experts=16, num_experts_per_tok=4)
STOCK_EXPERTS = ("grouped_mm", "eager")


def sharpen_router(model: transformers.MixtralForCausalLM) -> None:
    """A router sharper than the default init: tokens spread unevenly over the experts, as in trained models."""
    for layer in model.model.layers:
        layer.mlp.gate.weight.normal_(0.0, 0.5)


def bench_model(
    found: Checkpoints, runs: int, prefill: tuple[int, int], prompt: int, new: int
) -> tuple[list[list[str]], dict[str, float]]:
    stock = {impl: found.load_stock(experts_implementation=impl) for impl in STOCK_EXPERTS}
    ours = found.load_fivefold()
    vocab = ours.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(3, vocab, prefill, generator=gen)}
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    prompt_ids = torch.randint(3, vocab, (1, prompt), generator=gen)
    greedy = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    rows = []
    with torch.inference_mode():
        expected = stock["grouped_mm"](**batch).logits  # also the warm-up
        got = ours(**batch).logits
        diff = f"{float((expected - got).abs().max()):.1e}"
        exact = found.load_stock(dtype=torch.float64, experts_implementation="eager")
        truth = exact(**batch).logits
        del exact
        errors = {
            name: float((logits.double() - truth).abs().max())
            for name, logits in (("stock", expected), ("fivefold", got))
        }
        same = all(
            torch.equal(m.generate(prompt_ids, **greedy), ours.generate(prompt_ids, **greedy)) for m in stock.values()
        )
        models = {**stock, "fivefold": ours}
        t = alternate({name: (lambda m=m: m(**batch)) for name, m in models.items()}, runs)
        rows += [row("prefill", f"{prefill[0]}x{prefill[1]}", impl, t, diff) for impl in stock]
        t = alternate({name: (lambda m=m: m.generate(prompt_ids, **greedy)) for name, m in models.items()}, runs)
        rows += [row("generate", f"1x{prompt} +{new}", impl, t, "same" if same else "DIFFERENT") for impl in stock]
    return rows, errors


def bench_layer(fields: dict, runs: int, shapes: list[tuple[int, int]]) -> list[list[str]]:
    config = transformers.MixtralConfig(**fields)
    torch.manual_seed(0)
    stock = MixtralSparseMoeBlock(config).eval()
    hidden, width, experts = fields["hidden_size"], fields["intermediate_size"], fields["num_local_experts"]
    ours = MixtureOfExperts(MoESpec(hidden, width, experts, fields["num_experts_per_tok"])).eval()
    with torch.no_grad():
        stock.gate.weight.normal_(0.0, 0.5)
        stock.experts.gate_up_proj.normal_(0.0, 0.02)
        stock.experts.down_proj.normal_(0.0, 0.02)
    copy_stock_moe_block(stock, ours)

    def run_stock(impl, x):
        config._experts_implementation = impl
        return stock(x)

    rows = []
    with torch.inference_mode():
        for b, t in shapes:
            x = torch.randn(b, t, hidden, generator=torch.Generator().manual_seed(1))
            diff = max(float((run_stock(impl, x) - ours(x)).abs().max()) for impl in STOCK_EXPERTS)
            contenders = {impl: (lambda impl=impl, x=x: run_stock(impl, x)) for impl in STOCK_EXPERTS}
            contenders["fivefold"] = lambda x=x: ours(x)
            times = alternate(contenders, runs)
            rows += [row("MoE layer", f"{b}x{t}", impl, times, f"{diff:.1e}") for impl in STOCK_EXPERTS]
    return rows


def row(what: str, shape: str, impl: str, times: dict[str, Timing], check: str) -> list[str]:
    """A row of the timing table: stock with the experts implementation `impl` against fivefold."""
    s, f = times[impl].median, times["fivefold"].median
    return [what, shape, impl, f"{s * 1e3:,.1f}", f"{f * 1e3:,.1f}", f"{s / f:.2f}x", check]


def load_only(which: str, folder: str) -> None:
    """The child process of the loading measurement: load, touch the weights, exit."""
    transformers.utils.logging.set_verbosity_error()
    if which == "stock":
        model = transformers.MixtralForCausalLM.from_pretrained(folder)
    elif which == "fivefold":
        model = fivefold.FivefoldMixtralForCausalLM.from_pretrained(folder)
    else:
        return  # "baseline": the libraries alone
    assert sum(float(p.float().sum()) for p in model.parameters()) == sum(
        float(p.float().sum()) for p in model.parameters()
    )


def peak_rss(which: str, folder: Path) -> int:
    """Bytes: the maximum resident set size of a fresh process loading `folder`."""
    cmd = ["/usr/bin/time", "-v", python(), __file__, "--load-only", which, str(folder)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    kbytes = re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)
    return int(kbytes.group(1)) * 1024


def checkpoint_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def loading(found: Checkpoints) -> list[str]:
    """The report's loading section: peak RSS of fresh processes loading each checkpoint."""
    checkpoint = checkpoint_bytes(found.stock_dir)
    base = peak_rss("baseline", found.stock_dir)
    rows = []
    for which, folder in (("stock", found.stock_dir), ("fivefold", found.fivefold_dir)):
        peak = peak_rss(which, folder)
        rows.append([which, f"{peak / 2**20:,.0f}", f"{peak / checkpoint:.2f}x", f"{(peak - base) / checkpoint:.2f}x"])
    return [
        "",
        f"loading (fresh process, `/usr/bin/time -v`): checkpoint {checkpoint / 2**20:,.0f} MiB, "
        f"libraries alone {base / 2**20:,.0f} MiB RSS",
        "",
        *table(["loader", "peak RSS MiB", "peak / checkpoint", "(peak - libraries) / checkpoint"], rows),
    ]


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--no-loading", action="store_true", help="skip the loading-memory measurement")
    parser.add_argument("--load-only", nargs=2, metavar=("WHICH", "FOLDER"), help=argparse.SUPPRESS)
    args = parse(parser)
    if args.load_only:
        return load_only(*args.load_only)
    fields, fine = (architecture_for_model_type("mixtral").tiny, QUICK_FINE) if args.quick else (REDUCED, FINE_GRAINED)
    prefill, prompt, new = ((2, 16), 8, 8) if args.quick else ((4, 128), 32, 32)
    layer_shapes = [(2, 16), (2, 1)] if args.quick else [(4, 128), (4, 1)]

    header = ["what", "shape", "stock experts", "stock ms", "fivefold ms", "ratio (stock / fivefold time)",
              "max abs diff"]  # fmt: skip
    with checkpoints(transformers.MixtralForCausalLM, fields, init=sharpen_router) as found:
        rows, errors = bench_model(found, args.runs, prefill, prompt, new)
        rows += bench_layer(fine, args.runs, layer_shapes)
        lines = [
            machine_line(f"fp32, sdpa, median of {args.runs}{' (--quick sizes)' if args.quick else ''}"),
            "",
            *table(header, rows),
            "",
            f"prefill logits against the same model run in fp64 (exact up to fp64 rounding): stock fp32 is off by "
            f"{errors['stock']:.1e}, fivefold fp32 by {errors['fivefold']:.1e}",
        ]
        if not args.no_loading:
            lines += loading(found)
    write_report(lines, args.out, args.json, timing_results("Mixtral", rows))


if __name__ == "__main__":
    main()
