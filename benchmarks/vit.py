"""ViT forward speed, fivefold vs stock transformers, on identical weights at vit-base-patch16-224's size.

A random-initialised stock ViTForImageClassification (1000 classes) is saved, converted, and both models are
timed alternately in one process on the same batch of 8 images of 224 x 224. Reports images/s, the ratio
fivefold / stock and the max abs difference of the logits.

    python benchmarks/vit.py                  # vit-base-patch16-224, batch 8, markdown to stdout
    python benchmarks/vit.py --runs 7 --out results.md
    python benchmarks/vit.py --quick          # a tiny ViT, seconds: a smoke test of this script
"""

import torch
import transformers
from harness import alternate, checkpoints, command_line, machine_line, parse, size, table, write_report


def bench(fields: dict, batch: int, runs: int, attn: str) -> tuple[float, float, float]:
    """Images/s of stock and fivefold, and the max abs difference of their logits."""
    with checkpoints(transformers.ViTForImageClassification, fields) as found:
        stock, ours = found.load_stock(attn_implementation=attn), found.load_fivefold(attn_implementation=attn)
        pixels = stock.config.image_size
        inputs = {"pixel_values": torch.randn(batch, 3, pixels, pixels, generator=torch.Generator().manual_seed(0))}
        with torch.inference_mode():
            diff = float((stock(**inputs).logits - ours(**inputs).logits).abs().max())  # also the warm-up
            times = alternate({"stock": lambda: stock(**inputs), "fivefold": lambda: ours(**inputs)}, runs)
    return batch / times["stock"].median, batch / times["fivefold"].median, diff


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    args = parse(parser)
    fields, model_name = size("vit", "google/vit-base-patch16-224", args.quick)
    s, f, diff = bench(fields, args.batch, args.runs, args.attn)
    pixels = fields["image_size"]
    header = ["model", "batch", "stock images/s", "fivefold images/s", "ratio", "max abs diff (logits)"]
    row = [model_name, f"{args.batch} x {pixels}x{pixels}", f"{s:,.2f}", f"{f:,.2f}", f"{f / s:.2f}x", f"{diff:.1e}"]
    lines = [machine_line(f"fp32, {args.attn}, median of {args.runs}"), "", *table(header, [row])]
    result = {"architecture": "ViT", "benchmark": f"{model_name}, batch {args.batch}", "unit": "images/s",
              "higher_is_better": True, "stock": s, "fivefold": f}  # fmt: skip
    write_report(lines, args.out, args.json, [result])


if __name__ == "__main__":
    main()
