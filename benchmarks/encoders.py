"""Encoder forward speed, fivefold vs stock transformers, on identical weights at the public sizes.

Both models are timed alternately in one process on the same inputs: a full batch (8 x 128) and a ragged batch
(16 sequences, lengths uniform in 16..512, fixed seed, padded to the longest). fivefold runs as loaded, i.e.
unpadded on the ragged batch (config.unpad_inputs, on by default); `--padded` adds a row with it off. Reports real
(non-pad) tokens/s, the ratio fivefold / stock, and the max abs difference of the non-pad outputs.

    python benchmarks/encoders.py                       # bert-, roberta- and ModernBERT-base, markdown to stdout
    python benchmarks/encoders.py --archs bert --runs 7 --out results.md
    python benchmarks/encoders.py --quick               # tiny models and batches: a smoke test in seconds
"""

import argparse
import os
import platform
import re
import statistics
import tempfile
import time

import torch
import transformers

import fivefold
import fivefold.architectures

PUBLIC_SIZES = {
    "bert": ("BertModel", dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, pad_token_id=0)),
    "roberta": (
        "RobertaModel",
        dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5),
    ),
    "modernbert": ("ModernBertModel", {}),  # the stock defaults are ModernBERT-base
}
# (full batch rows x length, ragged batch rows, ragged lengths low..high)
SHAPES = {"public": ((8, 128), 16, (16, 512)), "quick": ((2, 16), 4, (4, 32))}


def machine() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return re.search(r"model name\s*:\s*(.*)", f.read())[1]
    except (OSError, TypeError):
        return platform.processor() or platform.machine()


def batches(vocab_size: int, pad: int, max_len: int, shapes: tuple) -> dict[str, dict]:
    (rows, length), ragged_rows, (low, high) = shapes
    gen = torch.Generator().manual_seed(0)
    full = torch.randint(5, vocab_size, (rows, length), generator=gen)
    lengths = torch.randint(low, min(high, max_len) + 1, (ragged_rows,), generator=gen)
    ragged = torch.randint(5, vocab_size, (ragged_rows, int(lengths.max())), generator=gen)
    mask = (torch.arange(ragged.shape[1])[None] < lengths[:, None]).long()
    return {
        f"full {rows}x{length}": {"input_ids": full, "attention_mask": torch.ones_like(full)},
        f"ragged {ragged_rows}x({low}..{high})": {
            "input_ids": ragged.masked_fill(mask == 0, pad),
            "attention_mask": mask,
        },
    }


def seconds(model, inputs) -> float:
    start = time.perf_counter()
    model(**inputs)
    return time.perf_counter() - start


def bench(arch: str, runs: int, folder: str, quick: bool, padded: bool) -> list[tuple]:
    stock_class, fields = PUBLIC_SIZES[arch]
    if quick:
        fields = fivefold.architectures.architecture_for_model_type(arch).tiny
    config = transformers.AutoConfig.for_model(arch, **fields)
    torch.manual_seed(0)
    getattr(transformers, stock_class)(config).save_pretrained(f"{folder}/{arch}-stock")
    fivefold.convert(f"{folder}/{arch}-stock", f"{folder}/{arch}-fivefold", progress=False)
    stock = getattr(transformers, stock_class).from_pretrained(f"{folder}/{arch}-stock").eval()
    variants = {"fivefold": transformers.AutoModel.from_pretrained(f"{folder}/{arch}-fivefold").eval()}
    if padded:
        variants["fivefold padded"] = transformers.AutoModel.from_pretrained(
            f"{folder}/{arch}-fivefold", unpad_inputs=False
        ).eval()
    shapes = SHAPES["quick" if quick else "public"]
    rows = []
    max_len = min(config.max_position_embeddings - 2, 512)
    for name, inputs in batches(config.vocab_size, config.pad_token_id, max_len, shapes).items():
        tokens = int(inputs["attention_mask"].sum())
        real = inputs["attention_mask"].bool()
        with torch.inference_mode():
            expected = stock(**inputs).last_hidden_state  # also warm-up
            diffs = {k: float((expected - m(**inputs)[0])[real].abs().max()) for k, m in variants.items()}
            times = {"stock": [], **{k: [] for k in variants}}
            for _ in range(runs):
                times["stock"].append(seconds(stock, inputs))
                for k, model in variants.items():
                    times[k].append(seconds(model, inputs))
        s = tokens / statistics.median(times["stock"])
        for k in variants:
            f = tokens / statistics.median(times[k])
            rows.append((arch, name, k, tokens, s, f, f / s, diffs[k]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", default=list(PUBLIC_SIZES), choices=list(PUBLIC_SIZES))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="tiny models and batches (seconds): a smoke test")
    parser.add_argument("--padded", action="store_true", help="also time fivefold with unpad_inputs=False")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    size = "tiny" if args.quick else "base"
    lines = [
        f"machine: {machine()} ({platform.machine()}), {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()};"
        f" torch {torch.__version__}, transformers {transformers.__version__}, fivefold {fivefold.__version__};"
        f" fp32, sdpa, median of {args.runs}",
        "",
        "| model | batch | fivefold | real tokens | stock tok/s | fivefold tok/s | ratio | max abs diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        for arch in args.archs:
            for arch_name, batch, variant, tokens, s, f, ratio, diff in bench(
                arch, args.runs, folder, args.quick, args.padded
            ):
                lines.append(
                    f"| {arch_name}-{size} | {batch} | {variant} | {tokens} | {s:,.0f} | {f:,.0f} | {ratio:.2f}x "
                    f"| {diff:.1e} |"
                )
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
