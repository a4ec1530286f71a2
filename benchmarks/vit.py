"""ViT forward speed, fivefold vs stock transformers, on identical weights at vit-base-patch16-224's size.

A random-initialised stock ViTForImageClassification (1000 classes) is saved, converted, and both models are
timed alternately in one process on the same batch of 8 images of 224 x 224. Reports images/s, the ratio
fivefold / stock and the max abs difference of the logits.

    python benchmarks/vit.py                  # vit-base-patch16-224, batch 8, markdown to stdout
    python benchmarks/vit.py --runs 7 --out results.md
    python benchmarks/vit.py --quick          # a tiny ViT, seconds: a smoke test of this script
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

VIT_BASE_PATCH16_224 = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, image_size=224,
    patch_size=16, num_labels=1000,
)  # fmt: skip
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
            patch_size=8, num_labels=10)  # fmt: skip


def seconds(model, inputs) -> float:
    start = time.perf_counter()
    model(**inputs)
    return time.perf_counter() - start


def bench(fields: dict, batch: int, runs: int, attn: str, folder: str) -> tuple:
    config = transformers.ViTConfig(**fields)
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).save_pretrained(f"{folder}/stock")
    fivefold.convert(f"{folder}/stock", f"{folder}/fivefold", progress=False)
    stock = transformers.ViTForImageClassification.from_pretrained(f"{folder}/stock", attn_implementation=attn)
    ours = transformers.AutoModelForImageClassification.from_pretrained(f"{folder}/fivefold", attn_implementation=attn)
    stock.eval(), ours.eval()
    size = config.image_size
    inputs = {"pixel_values": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))}
    with torch.inference_mode():
        diff = float((stock(**inputs).logits - ours(**inputs).logits).abs().max())  # also the warm-up
        times = {"stock": [], "fivefold": []}
        for _ in range(runs):
            times["stock"].append(seconds(stock, inputs))
            times["fivefold"].append(seconds(ours, inputs))
    s, f = (batch / statistics.median(times[k]) for k in ("stock", "fivefold"))
    return s, f, f / s, diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--quick", action="store_true", help="a tiny ViT and 2 runs: checks the script in seconds")
    parser.add_argument("--out", help="also write the markdown table here")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    fields, name = (TINY, "tiny ViT (32 px, patch 8)") if args.quick else (VIT_BASE_PATCH16_224, "vit-base-patch16-224")
    runs = 2 if args.quick else args.runs

    with tempfile.TemporaryDirectory() as folder:
        s, f, ratio, diff = bench(fields, args.batch, runs, args.attn, folder)
    size = fields["image_size"]
    report = "\n".join(
        [
            f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, "
            f"torch threads {torch.get_num_threads()}; torch {torch.__version__}, transformers "
            f"{transformers.__version__}, fivefold {fivefold.__version__}; fp32, {args.attn}, median of {runs}",
            "",
            "| model | batch | stock images/s | fivefold images/s | ratio | max abs diff (logits) |",
            "|---|---|---|---|---|---|",
            f"| {name} | {args.batch} x {size}x{size} | {s:,.2f} | {f:,.2f} | {ratio:.2f}x | {diff:.1e} |",
        ]
    )
    print(report)
    if args.out:
        with open(args.out, "w") as out:
            out.write(report + "\n")


if __name__ == "__main__":
    main()
