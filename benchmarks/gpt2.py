"""GPT-2 greedy generation speed, fivefold vs stock transformers, on identical weights.

GPT-2 124M (random init, fixed seed), batch 1, a 32-token prompt, 64 new tokens, fp32. Stock and fivefold are timed
alternately in one process. Reports tokens/s of the whole `generate` call and the ratio, the time of one decoding
step (from generating 64 tokens minus generating 1, so the prompt's prefill cancels), and the floor of a step: the
bytes of weights a step reads divided by the memory bandwidth measured here (a sum over a large tensor).
A third row runs fivefold with oneDNN turned off (`torch.backends.mkldnn.flags(enabled=False)`), so that its linears
take aten's matmul as stock's do: it separates the kernel's gain from the rest. The generated tokens must be
identical.

    python benchmarks/gpt2.py                 # markdown table to stdout
    python benchmarks/gpt2.py --runs 7 --threads 2 --out results.md
    python benchmarks/gpt2.py --quick         # tiny model, seconds: a smoke test
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

GPT2_124M = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
TINY = dict(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4)


def read_bandwidth(gib: float, repeats: int = 5) -> float:
    """Bytes/s of a sum over a tensor far larger than the caches (median of `repeats`)."""
    big = torch.ones(int(gib * 2**30) // 4)
    big.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        big.sum()
        times.append(time.perf_counter() - start)
    return big.numel() * 4 / statistics.median(times)


def weight_bytes_per_step(model: torch.nn.Module, config) -> int:
    """Every weight is read once per step, except the position table, of which one row is read. The word table is
    read whole, by the tied LM head."""
    unique = {p.data_ptr(): p for p in model.parameters()}.values()
    total = sum(p.numel() * p.element_size() for p in unique)
    positions = config.n_positions * config.n_embd * 4
    return total - positions + config.n_embd * 4


def timed(generate, model, prompt, new_tokens: int) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = generate(model, prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return time.perf_counter() - start, out


def ours_generate(model, prompt, **kwargs):
    return model.generate(prompt, **kwargs)


def aten_generate(model, prompt, **kwargs):
    """fivefold with its linears on aten's matmul, as stock's are."""
    with torch.backends.mkldnn.flags(enabled=False):
        return model.generate(prompt, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 runs, 8 tokens")
    parser.add_argument("--out", help="also write the markdown table here")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.new_tokens, args.prompt = 2, 8, 8
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    fields = TINY if args.quick else GPT2_124M
    config = transformers.GPT2Config(**fields)
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        transformers.GPT2LMHeadModel(config).save_pretrained(f"{folder}/stock")
        fivefold.convert(f"{folder}/stock", f"{folder}/fivefold", progress=False)
        stock = transformers.GPT2LMHeadModel.from_pretrained(f"{folder}/stock").eval()
        ours = transformers.AutoModelForCausalLM.from_pretrained(f"{folder}/fivefold").eval()
    for model in (stock, ours):
        model.generation_config.pad_token_id = config.eos_token_id
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    contenders = {
        "stock": (stock, ours_generate),
        "fivefold": (ours, ours_generate),
        "fivefold, oneDNN off": (ours, aten_generate),
    }

    full = {name: [] for name in contenders}
    step = {name: [] for name in contenders}
    outputs = {}
    for name, (model, generate) in contenders.items():  # warm-up
        _, outputs[name] = timed(generate, model, prompt, args.new_tokens)
    for _ in range(args.runs):
        for name, (model, generate) in contenders.items():
            t_all, _ = timed(generate, model, prompt, args.new_tokens)
            t_one, _ = timed(generate, model, prompt, 1)
            full[name].append(t_all)
            step[name].append((t_all - t_one) / (args.new_tokens - 1))
    identical = all(torch.equal(outputs["stock"], out) for out in outputs.values())

    bandwidth = read_bandwidth(0.125 if args.quick else 1.0)
    weight_bytes = weight_bytes_per_step(stock, config)
    floor_ms = weight_bytes / bandwidth * 1e3
    stock_tps = args.new_tokens / statistics.median(full["stock"])
    lines = [
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, torch threads "
        f"{torch.get_num_threads()}; torch {torch.__version__}, transformers {transformers.__version__}, fivefold "
        f"{fivefold.__version__}; fp32, sdpa, batch 1, prompt {args.prompt}, {args.new_tokens} new tokens, greedy, "
        f"median of {args.runs}",
        f"weights read per decoding step: {weight_bytes / 1e6:.0f} MB; measured read bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s; floor {floor_ms:.1f} ms/step; tokens identical to stock: {identical}",
        "",
        "| model | generate tok/s | ratio vs stock | ms per decoding step | step / floor |",
        "|---|---|---|---|---|",
    ]
    for name in contenders:
        tps = args.new_tokens / statistics.median(full[name])
        step_ms = statistics.median(step[name]) * 1e3
        label = f"{name} ({'GPT-2 tiny' if args.quick else 'GPT-2 124M'})"
        lines.append(f"| {label} | {tps:.1f} | {tps / stock_tps:.2f}x | {step_ms:.1f} | {step_ms / floor_ms:.2f}x |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    if not identical:
        raise SystemExit("generated tokens differ from stock")


if __name__ == "__main__":
    main()
