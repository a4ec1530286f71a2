"""Encoder forward speed, fivefold vs stock transformers, on identical weights at the public sizes.

Both models are timed alternately in one process on the same inputs: a full batch (8 x 128) and a ragged batch
(16 sequences, lengths uniform in 16..512, fixed seed, padded to the longest). Reports real (non-pad) tokens/s,
the ratio fivefold / stock, and the max abs difference of the non-pad outputs.

    python benchmarks/encoders.py                       # bert-base and roberta-base, markdown to stdout
    python benchmarks/encoders.py --archs bert --runs 7 --out results.md
"""

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch
import transformers

import fivefold

PUBLIC_SIZES = {
    "bert": ("BertModel", dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, pad_token_id=0)),
    "roberta": (
        "RobertaModel",
        dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5),
    ),
}


def batches(vocab_size: int, pad: int, max_len: int) -> dict[str, dict]:
    gen = torch.Generator().manual_seed(0)
    full = torch.randint(5, vocab_size, (8, 128), generator=gen)
    lengths = torch.randint(16, min(512, max_len) + 1, (16,), generator=gen)
    ragged = torch.randint(5, vocab_size, (16, int(lengths.max())), generator=gen)
    mask = (torch.arange(ragged.shape[1])[None] < lengths[:, None]).long()
    return {
        "full 8x128": {"input_ids": full, "attention_mask": torch.ones_like(full)},
        "ragged 16x(16..512)": {"input_ids": ragged.masked_fill(mask == 0, pad), "attention_mask": mask},
    }


def seconds(model, inputs) -> float:
    start = time.perf_counter()
    model(**inputs)
    return time.perf_counter() - start


def bench(arch: str, runs: int, folder: str) -> list[tuple]:
    stock_class, fields = PUBLIC_SIZES[arch]
    config = transformers.AutoConfig.for_model(arch, **fields)
    torch.manual_seed(0)
    getattr(transformers, stock_class)(config).save_pretrained(f"{folder}/{arch}-stock")
    fivefold.convert(f"{folder}/{arch}-stock", f"{folder}/{arch}-fivefold", progress=False)
    stock = getattr(transformers, stock_class).from_pretrained(f"{folder}/{arch}-stock").eval()
    ours = transformers.AutoModel.from_pretrained(f"{folder}/{arch}-fivefold").eval()
    rows = []
    for name, inputs in batches(config.vocab_size, config.pad_token_id, config.max_position_embeddings - 2).items():
        tokens = int(inputs["attention_mask"].sum())
        with torch.inference_mode():
            expected, got = stock(**inputs).last_hidden_state, ours(**inputs).last_hidden_state  # also warm-up
            diff = float((expected - got)[inputs["attention_mask"].bool()].abs().max())
            times = {"stock": [], "fivefold": []}
            for _ in range(runs):
                times["stock"].append(seconds(stock, inputs))
                times["fivefold"].append(seconds(ours, inputs))
        s, f = (tokens / statistics.median(times[k]) for k in ("stock", "fivefold"))
        rows.append((arch, name, tokens, s, f, f / s, diff))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", default=list(PUBLIC_SIZES), choices=list(PUBLIC_SIZES))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", help="also write the markdown table here")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    lines = [
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, "
        f"torch threads {torch.get_num_threads()}; torch {torch.__version__}, transformers {transformers.__version__},"
        f" fivefold {fivefold.__version__}; fp32, sdpa, median of {args.runs}",
        "",
        "| model | batch | real tokens | stock tok/s | fivefold tok/s | ratio | max abs diff |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        for arch in args.archs:
            for arch_name, batch, tokens, s, f, ratio, diff in bench(arch, args.runs, folder):
                lines.append(
                    f"| {arch_name}-base | {batch} | {tokens} | {s:,.0f} | {f:,.0f} | {ratio:.2f}x | {diff:.1e} |"
                )
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
