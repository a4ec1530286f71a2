"""GPT-2 greedy generation speed, fivefold vs stock transformers, on identical weights.

GPT-2 124M (random init, fixed seed), batch 1, a 32-token prompt, 64 new tokens, in fp32 and in bf16. Stock and
fivefold are timed alternately in one process. Reports tokens/s of the whole `generate` call and the ratio to stock
in the same dtype, the time of one decoding step (from generating 64 tokens minus generating 1, so the prompt's
prefill cancels), and the floor of a step: the bytes of weights a step reads (in the model's dtype: bf16 is half)
divided by the memory bandwidth measured here (a sum over a large tensor). Two more times split a step against
that floor: its matmul layers alone (each of a step's linears, or stock's Conv1D, on one row, back to back: what the
kernel costs), and a sum over each of those weights in the same order (what reading them in those pieces costs
without a matmul). A step's time less its linears' is everything else (attention, norms, the cache, Python).
A third row runs fivefold with oneDNN turned off (`torch.backends.mkldnn.flags(enabled=False)`), so that its linears
take aten's matmul as stock's do: it separates the kernel's gain from the rest. The generated fp32 tokens must be
identical; the bf16 ones are compared with stock bf16's and reported.

    python benchmarks/gpt2.py                 # markdown table to stdout
    python benchmarks/gpt2.py --runs 7 --threads 2 --out results.md
    python benchmarks/gpt2.py --quick         # tiny model, seconds: a smoke test
"""

import statistics

import torch
import transformers
from harness import alternate, checkpoints, command_line, machine_line, parse, size, table, write_report
from transformers.pytorch_utils import Conv1D


def read_bandwidth(gib: float, repeats: int = 5) -> float:
    """Bytes/s of a sum over a tensor far larger than the caches (median of `repeats`)."""
    big = torch.ones(int(gib * 2**30) // 4)
    big.sum()
    return big.numel() * 4 / alternate({"sum": big.sum}, repeats)["sum"].median


def weight_bytes_per_step(model: torch.nn.Module, config) -> int:
    """Every weight is read once per step, except the position table, of which one row is read. The word table is
    read whole, by the tied LM head. In the model's own dtype: bf16 weights are half the bytes."""
    unique = {p.data_ptr(): p for p in model.parameters()}.values()
    total = sum(p.numel() * p.element_size() for p in unique)
    width = next(iter(unique)).element_size()
    positions = config.n_positions * config.n_embd * width
    return total - positions + config.n_embd * width


def matmul_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, torch.Tensor]]:
    """Each layer a decoding step multiplies by (linears, stock's Conv1D, the tied LM head) in the model's order,
    with a one-row input of its width and dtype."""
    found = []
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear | Conv1D):
            width = layer.in_features if isinstance(layer, torch.nn.Linear) else layer.nx
            found.append((layer, torch.randn(1, 1, width, dtype=layer.weight.dtype)))
    return found


PASSES = 4  # over all the weights per timed call: one pass is tens of milliseconds, too short to time alone


def linears_alone(layers: list[tuple[torch.nn.Module, torch.Tensor]]) -> None:
    with torch.no_grad():
        for _ in range(PASSES):
            for layer, x in layers:
                layer(x)


def linears_alone_without_onednn(layers: list[tuple[torch.nn.Module, torch.Tensor]]) -> None:
    with torch.backends.mkldnn.flags(enabled=False):
        linears_alone(layers)


def weight_sums(layers: list[tuple[torch.nn.Module, torch.Tensor]]) -> None:
    with torch.no_grad():
        for _ in range(PASSES):
            for layer, _x in layers:
                layer.weight.sum()


def generate(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    return model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)


def generate_without_onednn(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """fivefold with its linears on aten's matmul, as stock's are."""
    with torch.backends.mkldnn.flags(enabled=False):
        return generate(model, prompt, new_tokens)


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parse(parser)
    if args.quick:
        args.new_tokens, args.prompt = 8, 8
    fields, model_name = size("gpt2", "openai-community/gpt2", args.quick)
    new = args.new_tokens

    with checkpoints(transformers.GPT2LMHeadModel, fields) as found:
        stock, ours = found.load_stock(), found.load_fivefold()
        stock_bf16, ours_bf16 = found.load_stock(dtype=torch.bfloat16), found.load_fivefold(dtype=torch.bfloat16)
        config = stock.config
        for model in (stock, ours, stock_bf16, ours_bf16):
            model.generation_config.pad_token_id = config.eos_token_id
        prompt = torch.randint(0, config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
        contenders = {
            "stock": (stock, generate),
            "fivefold": (ours, generate),
            "fivefold, oneDNN off": (ours, generate_without_onednn),
            "stock bf16": (stock_bf16, generate),
            "fivefold bf16": (ours_bf16, generate),
        }
        outputs = {label: run(model, prompt, new) for label, (model, run) in contenders.items()}  # also the warm-up
        identical = all(torch.equal(outputs["stock"], out) for k, out in outputs.items() if "bf16" not in k)
        # bf16 rounds differently from fp32 (and oneDNN's bf16 sums from aten's): reported, not required
        identical_bf16 = torch.equal(outputs["stock bf16"], outputs["fivefold bf16"])
        layers = {label: matmul_layers(model) for label, (model, _) in contenders.items()}
        alone = {k: linears_alone_without_onednn if "oneDNN off" in k else linears_alone for k in contenders}
        # In turn, each contender generates all the new tokens, then one: the difference is the decoding steps.
        runs = {
            (label, n): (lambda model=model, run=run, n=n: run(model, prompt, n))
            for label, (model, run) in contenders.items()
            for n in (new, 1)
        }
        for label in contenders:
            runs[label, "linears"] = lambda label=label: alone[label](layers[label])
        for label in ("stock", "stock bf16"):  # a model's weights, in its dtype: fivefold's are the same bytes
            runs[label, "sums"] = lambda label=label: weight_sums(layers[label])
        times = alternate(runs, args.runs)

    bandwidth = read_bandwidth(0.125 if args.quick else 1.0)
    weight_bytes = {k: weight_bytes_per_step(model, config) for k, (model, _) in contenders.items()}
    floor_ms = {k: b / bandwidth * 1e3 for k, b in weight_bytes.items()}
    rows = []
    for label in contenders:
        baseline = "stock bf16" if "bf16" in label else "stock"
        tps = new / times[label, new].median
        steps = [(a - b) / (new - 1) for a, b in zip(times[label, new].seconds, times[label, 1].seconds, strict=True)]
        step_ms = statistics.median(steps) * 1e3
        linears_ms = times[label, "linears"].median / PASSES * 1e3
        sums_ms = times[baseline, "sums"].median / PASSES * 1e3
        ratio = tps / (new / times[baseline, new].median)
        cells = [f"{label} ({model_name})", f"{tps:.1f}", f"{ratio:.2f}x", f"{step_ms:.1f}", f"{linears_ms:.1f}"]
        cells += [f"{sums_ms:.1f}", f"{floor_ms[label]:.1f}", f"{step_ms / floor_ms[label]:.2f}x"]
        rows.append([*cells, f"{linears_ms / floor_ms[label]:.2f}x"])
    header = ["model", "generate tok/s", "ratio vs stock (same dtype)", "ms per decoding step", "linears alone ms"]
    header += ["weight sums ms", "floor ms", "step / floor", "linears / floor"]
    lines = [
        machine_line(f"sdpa, batch 1, prompt {args.prompt}, {new} new tokens, greedy, median of {args.runs}"),
        f"weights read per decoding step: {weight_bytes['stock'] / 1e6:.0f} MB fp32, "
        f"{weight_bytes['stock bf16'] / 1e6:.0f} MB bf16; measured read bandwidth {bandwidth / 1e9:.1f} GB/s; "
        f"fp32 tokens identical to stock: {identical}; bf16 tokens identical to stock bf16: {identical_bf16}",
        "",
        *table(header, rows),
    ]
    results = []  # for benchmarks/charts.py
    for dtype, stock_label, ours_label in (("fp32", "stock", "fivefold"), ("bf16", "stock bf16", "fivefold bf16")):
        result = {"architecture": "GPT-2", "benchmark": f"{model_name}, greedy {new} tokens, batch 1, {dtype}"}
        result.update(unit="tokens/s", higher_is_better=True, stock=new / times[stock_label, new].median)
        results.append({**result, "fivefold": new / times[ours_label, new].median})
    write_report(lines, args.out, args.json, results)
    if not identical:
        raise SystemExit("generated tokens differ from stock")


if __name__ == "__main__":
    main()
