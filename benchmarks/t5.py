"""T5 speed, fivefold vs stock transformers, on identical weights (t5-small size, random init).

Both models are timed alternately in one process: the encoder forward on a full batch (8 x 128), and greedy
`generate()` of 32 new tokens (no early stop) for a padded batch of 4 prompts. Reports tokens/s, the ratio
fivefold / stock, and the max abs difference of the encoder outputs / whether the generated ids are identical.

    python benchmarks/t5.py                  # t5-small, markdown to stdout
    python benchmarks/t5.py --quick          # tiny sizes, seconds: a smoke test
    python benchmarks/t5.py --runs 7 --out results.md
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

T5_SMALL = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, decoder_start_token_id=0)
TINY = dict(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, decoder_start_token_id=0)


def inputs(vocab_size: int, batch: int, length: int, ragged: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab_size, (batch, length), generator=gen)
    lengths = torch.full((batch,), length)
    if ragged:  # the first row full, the others between half and full length
        lengths[1:] = torch.randint(length // 2, length + 1, (batch - 1,), generator=gen)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def bench(fields: dict, runs: int, new_tokens: int, enc_shape: tuple, gen_shape: tuple, folder: str) -> list[tuple]:
    config = transformers.T5Config(**fields)
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(f"{folder}/stock")
    fivefold.convert(f"{folder}/stock", f"{folder}/fivefold", progress=False)
    stock = transformers.T5ForConditionalGeneration.from_pretrained(f"{folder}/stock").eval()
    ours = transformers.AutoModelForSeq2SeqLM.from_pretrained(f"{folder}/fivefold").eval()
    rows = []

    enc = inputs(config.vocab_size, *enc_shape, ragged=False)
    gen = inputs(config.vocab_size, *gen_shape, ragged=True)
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1)
    jobs = {
        f"encoder forward {enc_shape[0]}x{enc_shape[1]}": (
            lambda m: m.get_encoder()(**enc).last_hidden_state,
            enc_shape[0] * enc_shape[1],
        ),
        f"greedy generate {new_tokens} tokens, batch {gen_shape[0]}": (
            lambda m: m.generate(**gen, **settings),
            gen_shape[0] * new_tokens,
        ),
    }
    with torch.inference_mode():
        for name, (run, tokens) in jobs.items():
            expected, got = run(stock), run(ours)  # also the warm-up
            if expected.is_floating_point():
                check = f"{float((expected - got).abs().max()):.1e}"
            else:
                check = "identical" if torch.equal(expected, got) else "DIFFERENT"
            times = {"stock": [], "fivefold": []}
            for _ in range(runs):
                for key, model in (("stock", stock), ("fivefold", ours)):
                    start = time.perf_counter()
                    run(model)
                    times[key].append(time.perf_counter() - start)
            s, f = (tokens / statistics.median(times[k]) for k in ("stock", "fivefold"))
            rows.append((name, s, f, f / s, check))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny model and inputs: a smoke test in seconds")
    parser.add_argument("--out", help="also write the markdown table here")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    fields, new_tokens, enc_shape, gen_shape = (
        (TINY, 4, (2, 16), (2, 8)) if args.quick else (T5_SMALL, 32, (8, 128), (4, 64))
    )
    runs = max(args.runs, 5) if args.quick else args.runs
    lines = [
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, "
        f"torch threads {torch.get_num_threads()}; torch {torch.__version__}, transformers {transformers.__version__},"
        f" fivefold {fivefold.__version__}; {'tiny' if args.quick else 't5-small'}, fp32, sdpa, median of {runs}",
        "",
        "| task | stock tok/s | fivefold tok/s | ratio | check |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        for name, s, f, ratio, check in bench(fields, runs, new_tokens, enc_shape, gen_shape, folder):
            lines.append(f"| {name} | {s:,.0f} | {f:,.0f} | {ratio:.2f}x | {check} |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
