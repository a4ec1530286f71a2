"""T5 speed, fivefold vs stock transformers, on identical weights (t5-small size, random init).

Both models are timed alternately in one process: the encoder forward on a full batch (8 x 128), and greedy
`generate()` of 32 new tokens (no early stop) for a padded batch of 4 prompts. Reports tokens/s, the ratio
fivefold / stock, and the max abs difference of the encoder outputs / whether the generated ids are identical.

    python benchmarks/t5.py                  # t5-small, markdown to stdout
    python benchmarks/t5.py --quick          # tiny sizes, seconds: a smoke test
    python benchmarks/t5.py --runs 7 --out results.md
"""

import torch
import transformers
from harness import alternate, checkpoints, command_line, machine_line, parse, size, table, write_report


def inputs(vocab_size: int, batch: int, length: int, ragged: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab_size, (batch, length), generator=gen)
    lengths = torch.full((batch,), length)
    if ragged:  # the first row full, the others between half and full length
        lengths[1:] = torch.randint(length // 2, length + 1, (batch - 1,), generator=gen)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def bench(fields: dict, runs: int, new_tokens: int, enc_shape: tuple, gen_shape: tuple) -> list[list[str]]:
    with checkpoints(transformers.T5ForConditionalGeneration, fields) as found:
        stock, ours = found.load_stock(), found.load_fivefold()
        enc = inputs(stock.config.vocab_size, *enc_shape, ragged=False)
        gen = inputs(stock.config.vocab_size, *gen_shape, ragged=True)
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
        rows = []
        with torch.inference_mode():
            for name, (run, tokens) in jobs.items():
                expected, got = run(stock), run(ours)  # also the warm-up
                if expected.is_floating_point():
                    check = f"{float((expected - got).abs().max()):.1e}"
                else:
                    check = "identical" if torch.equal(expected, got) else "DIFFERENT"
                times = alternate({"stock": lambda run=run: run(stock), "fivefold": lambda run=run: run(ours)}, runs)
                s, f = (tokens / times[k].median for k in ("stock", "fivefold"))
                rows.append([name, f"{s:,.0f}", f"{f:,.0f}", f"{f / s:.2f}x", check])
    return rows


def results(rows: list[list[str]], model_name: str) -> list[dict]:
    """The rows in benchmarks/charts.py's format."""
    return [
        {
            "architecture": "T5",
            "benchmark": f"{model_name}, {task}",
            "unit": "tokens/s",
            "higher_is_better": True,
            "stock": float(s.replace(",", "")),
            "fivefold": float(f.replace(",", "")),
        }
        for task, s, f, *_ in rows
    ]


def main() -> None:
    args = parse(command_line(__doc__))
    fields, model_name = size("t5", "google-t5/t5-small", args.quick)
    if args.quick:  # stock T5 (transformers 5.24) cannot generate with the tiny config's deeper decoder
        fields = {**fields, "num_decoder_layers": fields["num_layers"]}
    new_tokens, enc_shape, gen_shape = (4, (2, 16), (2, 8)) if args.quick else (32, (8, 128), (4, 64))
    rows = bench(fields, args.runs, new_tokens, enc_shape, gen_shape)
    header = ["task", "stock tok/s", "fivefold tok/s", "ratio", "check"]
    lines = [machine_line(f"{model_name}, fp32, sdpa, median of {args.runs}"), "", *table(header, rows)]
    write_report(lines, args.out, args.json, results(rows, model_name))


if __name__ == "__main__":
    main()
