"""Encoder forward speed, fivefold vs stock transformers, on identical weights at the public sizes.

Both models are timed alternately in one process on the same inputs: a full batch (8 x 128) and a ragged batch
(16 sequences, lengths uniform in 16..512, fixed seed, padded to the longest). fivefold runs as loaded, i.e.
unpadded on the ragged batch (config.unpad_inputs, on by default); `--padded` adds a row with it off. Reports real
(non-pad) tokens/s, the ratio fivefold / stock, and the max abs difference of the non-pad outputs.

    python benchmarks/encoders.py                       # bert-, roberta- and ModernBERT-base, markdown to stdout
    python benchmarks/encoders.py --archs bert --runs 7 --out results.md
    python benchmarks/encoders.py --quick               # tiny models and batches: a smoke test in seconds
"""

import torch
import transformers
from harness import alternate, checkpoints, command_line, machine_line, parse, size, table, write_report

# model type -> the stock class timed and the public checkpoint whose size it has
PUBLIC = {
    "bert": (transformers.BertModel, "google-bert/bert-base-uncased"),
    "roberta": (transformers.RobertaModel, "FacebookAI/roberta-base"),
    "modernbert": (transformers.ModernBertModel, "answerdotai/ModernBERT-base"),
}
# (full batch rows x length, ragged batch rows, ragged lengths low..high)
SHAPES = {"public": ((8, 128), 16, (16, 512)), "quick": ((2, 16), 4, (4, 32))}


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


def bench(arch: str, runs: int, quick: bool, padded: bool) -> list[list[str]]:
    stock_class, hub_id = PUBLIC[arch]
    fields, name = size(arch, hub_id, quick)
    with checkpoints(stock_class, fields) as found:
        stock = found.load_stock()
        variants = {"fivefold": found.load_fivefold()}
        if padded:
            variants["fivefold padded"] = found.load_fivefold(unpad_inputs=False)
        config = stock.config
        shapes = SHAPES["quick" if quick else "public"]
        max_len = min(config.max_position_embeddings - 2, 512)
        rows = []
        for batch, inputs in batches(config.vocab_size, config.pad_token_id, max_len, shapes).items():
            tokens = int(inputs["attention_mask"].sum())
            real = inputs["attention_mask"].bool()
            with torch.inference_mode():
                expected = stock(**inputs).last_hidden_state  # also warm-up
                diffs = {k: float((expected - m(**inputs)[0])[real].abs().max()) for k, m in variants.items()}
                models = {"stock": stock, **variants}
                times = alternate({k: (lambda m=m, x=inputs: m(**x)) for k, m in models.items()}, runs)
            s = tokens / times["stock"].median
            for k in variants:
                f = tokens / times[k].median
                rows.append([name, batch, k, str(tokens), f"{s:,.0f}", f"{f:,.0f}", f"{f / s:.2f}x", f"{diffs[k]:.1e}"])
    return rows


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--archs", nargs="+", default=list(PUBLIC), choices=list(PUBLIC))
    parser.add_argument("--padded", action="store_true", help="also time fivefold with unpad_inputs=False")
    args = parse(parser)
    header = ["model", "batch", "fivefold", "real tokens", "stock tok/s", "fivefold tok/s", "ratio", "max abs diff"]
    rows = [row for arch in args.archs for row in bench(arch, args.runs, args.quick, args.padded)]
    write_report([machine_line(f"fp32, sdpa, median of {args.runs}"), "", *table(header, rows)], args.out)


if __name__ == "__main__":
    main()
