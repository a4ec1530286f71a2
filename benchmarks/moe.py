"""Qwen3-MoE, fivefold vs stock transformers, on identical weights.

A reduced Qwen3-MoE (hidden 1024, 64 experts of width 256, top-8, 4 layers, 16 heads of 64, 4 key/value heads,
vocab 32000), alternately timed on the same inputs: a prefill of 4 x 128 tokens, and greedy decoding of 32 tokens
from a 32-token prompt (batch 1), against each of stock's experts implementations (`grouped_mm`, its default, and
`eager`). The decoding step is also set against its memory-bandwidth floor, as `benchmarks/gpt2.py` does: the
bytes of weights one step at batch 1 reads (attention, norms, routers, the k chosen experts of each layer, one
embedding row, the LM head) over the read bandwidth measured here.

    python benchmarks/moe.py                  # markdown to stdout (a few minutes on 2 cores)
    python benchmarks/moe.py --quick          # the table's tiny Qwen3-MoE, seconds: a smoke test
    python benchmarks/moe.py --runs 7 --out results.md
"""

import torch
import transformers
from gpt2 import read_bandwidth
from harness import (
    Checkpoints,
    Timing,
    alternate,
    checkpoints,
    command_line,
    machine_line,
    parse,
    table,
    timing_results,
    write_report,
)

from fivefold.architectures import architecture_for_model_type

# Not the table's Qwen3-30B-A3B (30B parameters, out of reach of a CPU): its routing (128 -> 64 experts, top-8,
# fine-grained experts) at a size whose prefill takes about a second; Mixtral's benchmark vocabulary.
REDUCED = dict(
    vocab_size=32000, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=256, num_experts=64,
    num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
    head_dim=64, max_position_embeddings=512,
)  # fmt: skip
STOCK_EXPERTS = ("grouped_mm", "eager")


def sharpen_router(model: transformers.Qwen3MoeForCausalLM) -> None:
    """A router sharper than the default init: tokens spread unevenly over the experts, as in trained models."""
    for layer in model.model.layers:
        if hasattr(layer.mlp, "gate"):  # not the dense layers (`mlp_only_layers`)
            layer.mlp.gate.weight.normal_(0.0, 0.5)


def step_bytes(model: transformers.Qwen3MoeForCausalLM) -> int:
    """The weights one decoding step at batch 1 reads, in the model's dtype: all but the other embedding rows and
    the experts no one chose (E - k of each layer's E)."""
    config = model.config
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    word = model.model.embed_tokens.weight
    unread = (word.shape[0] - 1) * word.shape[1] * word.element_size()
    for layer in model.model.layers:
        if not hasattr(layer.mlp, "experts"):
            continue
        experts = layer.mlp.experts
        per_expert = (experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()) * experts.down_proj.element_size()
        unread += (config.num_experts - config.num_experts_per_tok) * per_expert
    return total - unread


def row(what: str, shape: str, impl: str, times: dict[str, Timing], check: str, per: int = 1) -> list[str]:
    """A row of the timing table: stock with the experts implementation `impl` against fivefold (per step: /per)."""
    s, f = times[impl].median / per, times["fivefold"].median / per
    return [what, shape, impl, f"{s * 1e3:,.1f}", f"{f * 1e3:,.1f}", f"{s / f:.2f}x", check]


def bench(found: Checkpoints, runs: int, prefill: tuple[int, int], prompt: int, new: int) -> tuple[list, list[str]]:
    stock = {impl: found.load_stock(experts_implementation=impl) for impl in STOCK_EXPERTS}
    ours = found.load_fivefold()
    gen = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(3, ours.config.vocab_size, prefill, generator=gen)}
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    prompt_ids = torch.randint(3, ours.config.vocab_size, (1, prompt), generator=gen)
    greedy = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    models = {**stock, "fivefold": ours}
    rows = []
    with torch.inference_mode():
        expected = stock["grouped_mm"](**batch).logits  # also the warm-up
        diff = f"{float((expected - ours(**batch).logits).abs().max()):.1e}"
        tokens = {name: m.generate(prompt_ids, **greedy) for name, m in models.items()}
        same = all(torch.equal(t, tokens["fivefold"]) for t in tokens.values())
        t = alternate({name: (lambda m=m: m(**batch)) for name, m in models.items()}, runs)
        rows += [row("prefill", f"{prefill[0]}x{prefill[1]}", impl, t, diff) for impl in stock]
        t = alternate({name: (lambda m=m: m.generate(prompt_ids, **greedy)) for name, m in models.items()}, runs)
        check = "same tokens" if same else "DIFFERENT tokens"
        rows += [row("decode step", f"1x{prompt} +{new}", impl, t, check, per=new) for impl in stock]
    bandwidth = read_bandwidth(0.125 if prefill[1] < 64 else 1.0)
    floor_ms = step_bytes(stock["eager"]) / bandwidth * 1e3
    step_ms = t["fivefold"].median / new * 1e3
    notes = [
        f"decode step floor: {step_bytes(stock['eager']) / 1e6:.0f} MB of weights a step reads at batch 1 over a "
        f"measured read bandwidth of {bandwidth / 1e9:.1f} GB/s = {floor_ms:.2f} ms; fivefold's step (prompt "
        f"included, spread over the new tokens) is {step_ms / floor_ms:.1f}x the floor",
    ]
    return rows, notes


def main() -> None:
    args = parse(command_line(__doc__))
    fields = architecture_for_model_type("qwen3_moe").tiny if args.quick else REDUCED
    prefill, prompt, new = ((2, 16), 8, 8) if args.quick else ((4, 128), 32, 32)
    header = ["what", "shape", "stock experts", "stock ms", "fivefold ms", "ratio (stock / fivefold time)",
              "check"]  # fmt: skip
    with checkpoints(transformers.Qwen3MoeForCausalLM, fields, init=sharpen_router) as found:
        rows, notes = bench(found, args.runs, prefill, prompt, new)
    lines = [
        machine_line(f"fp32, sdpa, median of {args.runs}{' (--quick sizes)' if args.quick else ''}"),
        "",
        *table(header, rows),
        "",
        *notes,
    ]
    write_report(lines, args.out, args.json, timing_results("Qwen3-MoE", rows))


if __name__ == "__main__":
    main()
