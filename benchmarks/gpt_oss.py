"""A reduced gpt-oss, fivefold vs stock transformers, on identical weights.

In one run, alternately timed on the same inputs: a reduced gpt-oss (hidden 1024, 16 experts of width 1024, top-4,
4 layers alternating sliding (window 64) and full attention, 16 heads of 64, 4 key/value heads, attention sinks,
yarn positions, vocab 32000): prefill of 4 x 128 tokens, and greedy generation of 32 tokens from a 32-token prompt,
against each of stock's experts implementations (`grouped_mm`, its default, and `eager`). Stock runs eager
attention (it has no sdpa for the sinks); fivefold its default, sdpa with the sinks as one more key.

    python benchmarks/gpt_oss.py                  # markdown to stdout
    python benchmarks/gpt_oss.py --quick          # tiny sizes, seconds: a smoke test
    python benchmarks/gpt_oss.py --runs 7 --out results.md
"""

import transformers
from harness import checkpoints, command_line, machine_line, parse, table, timing_results, write_report
from mixtral import bench_model

from fivefold.architectures import architecture_for_model_type

# Not the table's gpt-oss-20b (21B parameters, 84 GB in fp32): its routing (top-4 of a biased router), its sinks,
# its alternating windows and yarn positions at a size whose prefill takes about a second.
REDUCED = dict(
    vocab_size=32000, hidden_size=1024, intermediate_size=1024, num_local_experts=16, num_experts_per_tok=4,
    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4, head_dim=64, sliding_window=64,
)  # fmt: skip


def sharpen_router(model: transformers.GptOssForCausalLM) -> None:
    """A router sharper than the default init: tokens spread unevenly over the experts, as in trained models."""
    for layer in model.model.layers:
        layer.mlp.router.weight.normal_(0.0, 0.5)


def main() -> None:
    args = parse(command_line(__doc__))
    fields = architecture_for_model_type("gpt_oss").tiny if args.quick else REDUCED
    prefill, prompt, new = ((2, 16), 8, 8) if args.quick else ((4, 128), 32, 32)
    header = ["what", "shape", "stock experts", "stock ms", "fivefold ms", "ratio (stock / fivefold time)",
              "max abs diff"]  # fmt: skip
    with checkpoints(transformers.GptOssForCausalLM, fields, init=sharpen_router) as found:
        rows, errors = bench_model(found, args.runs, prefill, prompt, new)
    lines = [
        machine_line(f"fp32, stock eager / fivefold sdpa, median of {args.runs}{' (--quick sizes)' * args.quick}"),
        "",
        *table(header, rows),
        "",
        f"prefill logits against the same model run in fp64 (exact up to fp64 rounding): stock fp32 is off by "
        f"{errors['stock']:.1e}, fivefold fp32 by {errors['fivefold']:.1e}",
    ]
    write_report(lines, args.out, args.json, timing_results("gpt-oss", rows))


if __name__ == "__main__":
    main()
