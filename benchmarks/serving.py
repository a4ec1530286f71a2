"""Serving under continuous batching, fivefold vs stock transformers, on identical weights.

16 concurrent requests of mixed prompt lengths go through transformers' continuous-batching manager
(`generate_batch`, paged attention), greedy, on GPT-2 (the public gpt2 size) and the reduced Mixtral of
benchmarks/mixtral.py; each contender runs the same requests alternately. Reported per contender: requests/s,
generated tokens/s, time to first token and per-token latency (median and p95, from the manager's timestamps), and
whether every answer equals stock's. (The server's load test of issue 27, 200 requests from 16 clients through a
loopback `transformers serve`, is not written yet.)

    python benchmarks/serving.py                  # markdown to stdout (minutes on a quiet machine)
    python benchmarks/serving.py --quick          # tiny sizes, seconds: a smoke test
"""

import itertools
import statistics
import time

import torch
import transformers
from harness import checkpoints, command_line, machine_line, parse, size, table, write_report
from mixtral import REDUCED
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

REQUESTS, NEW_TOKENS = 16, 32
PROMPT_LENGTHS = (8, 16, 32, 64, 128, 256)  # cycled over the requests
QUICK_MIXTRAL = dict(
    vocab_size=99,
    hidden_size=32,
    intermediate_size=40,
    num_local_experts=4,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def prompts(vocab: int, count: int, lengths: tuple[int, ...], limit: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [
        torch.randint(3, vocab, (min(lengths[i % len(lengths)], limit),), generator=gen).tolist() for i in range(count)
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def run_batch(model, requests: list[list[int]], new: int, cb: dict) -> tuple[float, dict]:
    config = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    start = time.perf_counter()
    outputs = model.generate_batch(
        requests, config, continuous_batching_config=ContinuousBatchingConfig(**cb), record_timestamps=True
    )
    return time.perf_counter() - start, outputs


def measure(model, requests: list[list[int]], new: int, cb: dict) -> dict:
    seconds, outputs = run_batch(model, requests, new, cb)
    ttft, per_token, tokens = [], [], {}
    for rid, out in outputs.items():
        tokens[rid] = out.generated_tokens
        stamps = out.timestamps or []
        if stamps:
            ttft.append(stamps[0] - out.created_time)
            per_token += [b - a for a, b in itertools.pairwise(stamps)]
    generated = sum(len(t) for t in tokens.values())
    return {
        "seconds": seconds,
        "requests/s": len(requests) / seconds,
        "tokens/s": generated / seconds,
        "ttft": (statistics.median(ttft), percentile(ttft, 0.95)) if ttft else (float("nan"),) * 2,
        "per_token": (statistics.median(per_token), percentile(per_token, 0.95)) if per_token else (float("nan"),) * 2,
        "tokens": tokens,
    }


def bench(name: str, architecture: str, stock_class, fields: dict, args, cb: dict) -> tuple[list, list[dict]]:
    rows, results = [], []
    with checkpoints(stock_class, fields) as found:
        models = {"stock": found.load_stock(attn_implementation="sdpa"), "fivefold": found.load_fivefold()}
        vocab = models["stock"].config.vocab_size
        limit = getattr(models["stock"].config, "n_positions", None) or models["stock"].config.max_position_embeddings
        requests = prompts(vocab, REQUESTS, args.lengths, limit - args.new)
        runs = {key: [] for key in models}
        for _ in range(args.runs):  # alternately, so that the machine's load hits both alike
            for key, model in models.items():
                runs[key].append(measure(model, requests, args.new, cb))
        best = {key: min(r, key=lambda m: m["seconds"]) for key, r in runs.items()}
        same = best["stock"]["tokens"] == best["fivefold"]["tokens"]
        for key, m in best.items():
            rows.append(
                [
                    name,
                    key,
                    f"{m['requests/s']:.2f}",
                    f"{m['tokens/s']:.1f}",
                    f"{m['ttft'][0] * 1e3:.1f}",
                    f"{m['ttft'][1] * 1e3:.1f}",
                    f"{m['per_token'][0] * 1e3:.2f}",
                    f"{m['per_token'][1] * 1e3:.2f}",
                    "yes" if same else "NO",
                ]
            )
        results.append(  # for benchmarks/charts.py
            {
                "architecture": architecture,
                "benchmark": f"{name}, serving {len(requests)} requests (continuous batching)",
                "unit": "tokens/s",
                "higher_is_better": True,
                "stock": best["stock"]["tokens/s"],
                "fivefold": best["fivefold"]["tokens/s"],
            }
        )
    return rows, results


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--new", type=int, help=f"new tokens per request (default {NEW_TOKENS}, 4 --quick)")
    args = parse(parser)
    args.new = args.new or (4 if args.quick else NEW_TOKENS)
    args.lengths = (3, 5, 9) if args.quick else PROMPT_LENGTHS
    cb = (
        dict(num_blocks=256, page_size=16, max_batch_tokens=256)
        if not args.quick
        else dict(num_blocks=64, page_size=4, max_batch_tokens=32)
    )
    gpt2_fields, gpt2_name = size("gpt2", "openai-community/gpt2", args.quick)
    mixtral_fields = QUICK_MIXTRAL if args.quick else REDUCED
    rows, results = [], []
    for name, architecture, cls, fields in (
        (gpt2_name, "GPT-2", transformers.GPT2LMHeadModel, gpt2_fields),
        ("reduced Mixtral" + " (tiny)" * args.quick, "Mixtral", transformers.MixtralForCausalLM, mixtral_fields),
    ):
        more_rows, more_results = bench(name, architecture, cls, fields, args, cb)
        rows += more_rows
        results += more_results
    lines = [
        machine_line(
            f"{REQUESTS} requests, prompts of {args.lengths} tokens cycled, {args.new} new tokens each, "
            f"greedy, generate_batch with {cb}; best of {args.runs} alternated runs"
        ),
        "",
        *table(
            [
                "model",
                "contender",
                "requests/s",
                "tokens/s",
                "TTFT median ms",
                "TTFT p95 ms",
                "per-token median ms",
                "per-token p95 ms",
                "answers equal stock's",
            ],
            rows,
        ),
    ]
    write_report(lines, args.out, args.json, results)


if __name__ == "__main__":
    main()
