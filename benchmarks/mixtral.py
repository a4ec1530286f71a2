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
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

import fivefold
from fivefold.conversion.mixtral import copy_stock_moe_block
from fivefold.modeling.moe import MixtureOfExperts, MoESpec

REDUCED = dict(
    vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_local_experts=8, num_experts_per_tok=2,
    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
)  # fmt: skip
FINE_GRAINED = dict(hidden_size=512, intermediate_size=256, num_local_experts=64, num_experts_per_tok=8)
QUICK = dict(
    vocab_size=1000, hidden_size=128, intermediate_size=256, num_local_experts=8, num_experts_per_tok=2,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
)  # fmt: skip
QUICK_FINE = dict(hidden_size=64, intermediate_size=32, num_local_experts=16, num_experts_per_tok=4)
STOCK_EXPERTS = ("grouped_mm", "eager")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(contenders: dict, runs: int) -> dict[str, float]:
    """Median seconds of each contender, timed in turn so that load changes hit all of them alike."""
    times = {name: [] for name in contenders}
    for _ in range(runs):
        for name, fn in contenders.items():
            times[name].append(timed(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def build_checkpoints(fields: dict, folder: Path) -> tuple[Path, Path]:
    """A random stock Mixtral saved in the public per-expert layout, and its fivefold conversion."""
    config = transformers.MixtralConfig(**fields)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config)
    with torch.no_grad():  # a router sharper than the default init: tokens spread unevenly, as in trained models
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    model.save_pretrained(folder / "stock")
    del model
    fivefold.convert(folder / "stock", folder / "fivefold", progress=False)
    return folder / "stock", folder / "fivefold"


def bench_model(stock_dir: Path, our_dir: Path, runs: int, prefill: tuple[int, int], prompt: int, new: int):
    stock = {
        impl: transformers.MixtralForCausalLM.from_pretrained(stock_dir, experts_implementation=impl).eval()
        for impl in STOCK_EXPERTS
    }
    ours = fivefold.FivefoldMixtralForCausalLM.from_pretrained(our_dir).eval()
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
        diff = float((expected - got).abs().max())
        exact = transformers.MixtralForCausalLM.from_pretrained(
            stock_dir, dtype=torch.float64, experts_implementation="eager"
        ).eval()
        truth = exact(**batch).logits
        del exact
        errors = {
            name: float((logits.double() - truth).abs().max())
            for name, logits in (("stock", expected), ("fivefold", got))
        }
        same = all(
            torch.equal(m.generate(prompt_ids, **greedy), ours.generate(prompt_ids, **greedy)) for m in stock.values()
        )
        contenders = {impl: (lambda m=m: m(**batch)) for impl, m in stock.items()}
        contenders["fivefold"] = lambda: ours(**batch)
        t = alternate(contenders, runs)
        tokens = prefill[0] * prefill[1]
        rows += [
            ("prefill", f"{prefill[0]}x{prefill[1]}", impl, tokens, t[impl], t["fivefold"], diff) for impl in stock
        ]
        contenders = {impl: (lambda m=m: m.generate(prompt_ids, **greedy)) for impl, m in stock.items()}
        contenders["fivefold"] = lambda: ours.generate(prompt_ids, **greedy)
        t = alternate(contenders, runs)
        rows += [
            ("generate", f"1x{prompt} +{new}", impl, new, t[impl], t["fivefold"], "same" if same else "DIFFERENT")
            for impl in stock
        ]
    return rows, errors


def bench_layer(fields: dict, runs: int, shapes: list[tuple[int, int]]):
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
            rows += [
                ("MoE layer", f"{b}x{t}", impl, b * t, times[impl], times["fivefold"], diff) for impl in STOCK_EXPERTS
            ]
    return rows


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
    cmd = ["/usr/bin/time", "-v", sys.executable, __file__, "--load-only", which, str(folder)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    kbytes = re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)
    return int(kbytes.group(1)) * 1024


def checkpoint_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test in seconds")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--no-loading", action="store_true", help="skip the loading-memory measurement")
    parser.add_argument("--load-only", nargs=2, metavar=("WHICH", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_only:
        return load_only(*args.load_only)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    fields, fine = (QUICK, QUICK_FINE) if args.quick else (REDUCED, FINE_GRAINED)
    runs = 2 if args.quick else args.runs
    prefill, prompt, new = ((2, 16), 8, 8) if args.quick else ((4, 128), 32, 32)

    lines = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, fivefold {fivefold.__version__}; "
        f"fp32, sdpa, median of {runs}{' (--quick sizes)' if args.quick else ''}",
        "",
        "| what | shape | stock experts | stock ms | fivefold ms | ratio (stock / fivefold time) | max abs diff |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        stock_dir, our_dir = build_checkpoints(fields, Path(tmp))
        rows, errors = bench_model(stock_dir, our_dir, runs, prefill, prompt, new)
        rows += bench_layer(fine, runs, [(4, 128), (4, 1)] if not args.quick else [(2, 16), (2, 1)])
        for what, shape, impl, _, s, f, diff in rows:
            shown = diff if isinstance(diff, str) else f"{diff:.1e}"
            lines.append(f"| {what} | {shape} | {impl} | {s * 1e3:,.1f} | {f * 1e3:,.1f} | {s / f:.2f}x | {shown} |")
        lines += [
            "",
            f"prefill logits against the same model run in fp64 (exact up to fp64 rounding): stock fp32 is off by "
            f"{errors['stock']:.1e}, fivefold fp32 by {errors['fivefold']:.1e}",
        ]

        if not args.no_loading:
            size = checkpoint_bytes(stock_dir)
            base = peak_rss("baseline", stock_dir)
            lines += [
                "",
                f"loading (fresh process, `/usr/bin/time -v`): checkpoint {size / 2**20:,.0f} MiB, "
                f"libraries alone {base / 2**20:,.0f} MiB RSS",
                "",
                "| loader | peak RSS MiB | peak / checkpoint | (peak - libraries) / checkpoint |",
                "|---|---|---|---|",
            ]
            for which, folder in (("stock", stock_dir), ("fivefold", our_dir)):
                peak = peak_rss(which, folder)
                lines.append(f"| {which} | {peak / 2**20:,.0f} | {peak / size:.2f}x | {(peak - base) / size:.2f}x |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")


if __name__ == "__main__":
    main()
