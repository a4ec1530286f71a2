#!/usr/bin/env bash
# fivefold's GPU checks and speed table, for a machine with a CUDA GPU and a CUDA build of torch. CI never runs it
# (CI has no GPU); every check also has a CPU counterpart in tests/. Each section prints its result and goes on;
# the script exits 1 if any parity check failed, 0 otherwise (a section whose requirement is missing, such as the
# flash_attn package or a second process group backend, says "skipped" and does not fail).
#
#   bash benchmarks/gpu.sh            # the checks and the table at the public sizes (a few minutes on one GPU)
#   bash benchmarks/gpu.sh --quick    # tiny models: a smoke test of the script
#
# Sections: 1 flash-attention varlen for the unpadded encoders against stock's padding-free flash path; 2 bf16
# parity on CUDA (fivefold no less exact than stock bf16, both against stock fp32); 3 Mixtral with its experts split
# between cuda:0 and cpu by device_map (same logits and greedy generations as on one device); 4 expert parallelism
# with nccl at world size 1 (benchmarks/distributed.py, where it exists); 5 torch.compile on CUDA (fullgraph, parity,
# compile time against stock's); 6 a speed table against stock; 7 experts in CPU memory under cuda:0 through the
# expert cache, computed on the CPU or moved (modeling/expert_placement.py), each against the model on one device;
# 8 bitsandbytes 8-bit and NF4 on the reduced Mixtral: every expert quantized (stock's fused experts stay fp32), the
# error against stock's where both quantize the same modules, generate, save and reload.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
export HF_HUB_OFFLINE=1 QUICK

python - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"no CUDA device visible to torch {torch.__version__} (a CUDA build and a GPU are needed)")
print(f"# fivefold GPU checks: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PY

status=0

python - <<'PY' || status=1
"""Sections 1-3 and 5-8, in one process (the tiny or public checkpoints are built once)."""
import os, statistics, sys, tempfile, time, traceback
from pathlib import Path

import torch
import transformers

import fivefold
from fivefold.architectures import architecture_for_model_type, stock_class_name

transformers.utils.logging.set_verbosity_error()
QUICK = os.environ["QUICK"] == "1"
CUDA = torch.device("cuda:0")
failures, speed_rows = [], []
work = Path(tempfile.mkdtemp(prefix="fivefold-gpu-"))


def checkpoint(model_type: str, stock_name: str, fields: dict | None = None) -> tuple[Path, Path]:
    """A random stock checkpoint (tiny with --quick, else `fields`) and its conversion."""
    arch = architecture_for_model_type(model_type)
    sized = not QUICK and fields is not None
    config = transformers.AutoConfig.for_model(model_type, **(fields if sized else arch.tiny))
    torch.manual_seed(0)
    name = f"{stock_name}-sized" if sized else stock_name  # one class is built tiny and sized by different sections
    src, dst = work / f"{name}-stock", work / f"{name}-fivefold"
    if not src.exists():
        getattr(transformers, stock_name)(config).save_pretrained(src)
        fivefold.convert(src, dst, progress=False)
    return src, dst


def ours(model_type: str, stock_name: str, dst: Path, **kwargs):
    return architecture_for_model_type(model_type).class_named(stock_name).from_pretrained(dst, **kwargs).eval()


def ragged(vocab: int, pad: int, rows: int, low: int, high: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(low, high + 1, (rows,), generator=gen)
    ids = torch.randint(5, vocab, (rows, int(lengths.max())), generator=gen)
    mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
    return {"input_ids": ids.masked_fill(mask == 0, pad).to(CUDA), "attention_mask": mask.to(CUDA)}


def timed(fn, runs: int = 3 if QUICK else 10) -> float:
    """Median seconds of `fn` after one warm-up, synchronised."""
    fn()
    seconds = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def section(title: str):
    def run(fn):
        print(f"\n## {title}")
        try:
            fn()
        except Exception:
            failures.append(title)
            traceback.print_exc(limit=4)
            print(f"FAILED: {title}")
        return fn

    return run


def check(name: str, value: float, limit: float) -> None:
    ok = value <= limit
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {value:.2e} (limit {limit:.3g})")
    if not ok:
        failures.append(name)


BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512)


@section("1. flash-attention varlen: unpadded encoders vs stock's padding-free flash path")
def flash_varlen():
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        print("skipped: the flash_attn package is not installed")
        return
    for model_type, stock_name in (("bert", "BertModel"), ("modernbert", "ModernBertModel")):
        src, dst = checkpoint(model_type, stock_name, BERT_BASE if model_type == "bert" else None)
        kw = dict(attn_implementation="flash_attention_2", dtype=torch.bfloat16)
        stock = getattr(transformers, stock_name).from_pretrained(src, **kw).to(CUDA).eval()
        model = ours(model_type, stock_name, dst, **kw).to(CUDA)
        inputs = ragged(stock.config.vocab_size, stock.config.pad_token_id or 0, 16, 16, 64 if QUICK else 512)
        real = inputs["attention_mask"].bool()
        with torch.no_grad():
            a, b = stock(**inputs).last_hidden_state, model(**inputs).last_hidden_state
            reference = getattr(transformers, stock_name).from_pretrained(src, dtype=torch.float32).to(CUDA).eval()
            exact = reference(**inputs).last_hidden_state
        stock_error = (a.float() - exact)[real].abs().max().item()
        check(f"{model_type} flash varlen vs stock flash (bf16, real tokens)", (a - b).float()[real].abs().max().item(),
              max(4 * stock_error, 1e-2))
        check(f"{model_type} flash varlen error vs fp32, relative to stock's", (b.float() - exact)[real].abs().max().item(),
              1.25 * stock_error)
        tokens = int(real.sum())
        with torch.no_grad():
            s, f = timed(lambda: stock(**inputs)), timed(lambda: model(**inputs))
        speed_rows.append((f"{model_type} ragged 16 rows, bf16, flash", tokens / s, tokens / f))


@section("2. bf16 parity on CUDA (fivefold within stock's own bf16 error, both vs stock fp32)")
def bf16_parity():
    for model_type, stock_name in (("bert", "BertModel"), ("gpt2", "GPT2LMHeadModel"), ("vit", "ViTModel"),
                                   ("mixtral", "MixtralForCausalLM"), ("t5", "T5ForConditionalGeneration")):
        arch = architecture_for_model_type(model_type)
        src, dst = checkpoint(model_type, stock_name)
        stock = getattr(transformers, stock_name).from_pretrained(src).to(CUDA).eval()
        inputs = {k: v.to(CUDA) for k, v in arch.sample_inputs(stock.config, stock_name, 0).items()}
        with torch.no_grad():
            out = stock(**inputs)
            exact = (out.logits if "logits" in out else out.last_hidden_state).float()
            low = {k: v.bfloat16() if v.is_floating_point() else v for k, v in inputs.items()}
            errors = {}
            for who, model in (("stock", stock.to(torch.bfloat16)),
                               ("fivefold", ours(model_type, stock_name, dst, dtype=torch.bfloat16).to(CUDA))):
                o = model(**low)
                got = (o.logits if "logits" in o else o.last_hidden_state).float()
                mask = inputs.get("attention_mask")
                keep = mask.bool() if mask is not None and mask.shape == got.shape[:2] else torch.ones_like(got[..., 0], dtype=torch.bool)
                errors[who] = (got - exact)[keep].abs().max().item()
        check(f"{model_type} bf16 error (fivefold {errors['fivefold']:.2e}, stock {errors['stock']:.2e}) / stock's",
              errors["fivefold"] / max(errors["stock"], 1e-12), 1.25)


@section("3. Mixtral with experts split between cuda:0 and cpu by device_map")
def mixtral_split():
    src, dst = checkpoint("mixtral", "MixtralForCausalLM")
    cls = architecture_for_model_type("mixtral").class_named("MixtralForCausalLM")
    config = cls.config_class.from_pretrained(dst)
    with torch.device("meta"):
        skeleton = cls(config)
    owners = [name for name, m in skeleton.named_modules() if list(m.parameters(recurse=False))]
    # Every other expert of every layer on the CPU, the rest (and everything else) on the GPU.
    device_map = {name: ("cpu" if ".experts." in name and int(name.split(".experts.")[1].split(".")[0]) % 2 else 0)
                  for name in owners}
    split = cls.from_pretrained(dst, device_map=device_map).eval()
    whole = cls.from_pretrained(dst).to(CUDA).eval()
    placed = {str(p.device) for n, p in split.named_parameters() if ".experts." in n}
    print(f"expert parameters on: {sorted(placed)}")
    if len(placed) < 2:
        failures.append("mixtral split: experts not on two devices")
    ids = torch.randint(5, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)).to(CUDA)
    with torch.no_grad():
        check("mixtral logits split vs one device", (split(ids).logits - whole(ids).logits).abs().max().item(), 1e-4)
        greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
        same = torch.equal(split.generate(ids, **greedy), whole.generate(ids, **greedy))
    print(f"{'ok  ' if same else 'FAIL'} mixtral greedy generations identical split vs one device: {same}")
    if not same:
        failures.append("mixtral split generations")


@section("5. torch.compile on CUDA (fullgraph=True): parity and compile time vs stock")
def compile_cuda():
    for model_type, stock_name, fields in (("bert", "BertModel", BERT_BASE), ("gpt2", "GPT2Model", None)):
        arch = architecture_for_model_type(model_type)
        src, dst = checkpoint(model_type, stock_name, fields)
        stock = getattr(transformers, stock_name).from_pretrained(src).to(CUDA).eval()
        model = ours(model_type, stock_name, dst).to(CUDA)
        inputs = {k: v.to(CUDA) for k, v in arch.sample_inputs(stock.config, stock_name, 0).items()}
        options = {"use_cache": False} if model_type == "gpt2" else {}
        with torch.no_grad():
            eager = model(**inputs, **options).last_hidden_state
            seconds = {}
            for who, m in (("stock", stock), ("fivefold", model)):
                torch._dynamo.reset()
                compiled = torch.compile(m, fullgraph=True)
                start = time.perf_counter()
                out = compiled(**inputs, **options).last_hidden_state
                torch.cuda.synchronize()
                seconds[who] = time.perf_counter() - start
                if who == "fivefold":
                    real = inputs["attention_mask"].bool()
                    check(f"{model_type} compiled vs eager (real tokens)", (out - eager)[real].abs().max().item(), 1e-4)
                    run_ours = lambda c=compiled: c(**inputs, **options)
                else:
                    run_stock = lambda c=compiled: c(**inputs, **options)
            print(f"{model_type} first compiled call: stock {seconds['stock']:.1f} s, fivefold {seconds['fivefold']:.1f} s")
            tokens = int(inputs["attention_mask"].sum())
            speed_rows.append((f"{model_type} sample batch, fp32, compiled", tokens / timed(run_stock),
                               tokens / timed(run_ours)))


@section("6. speed against stock (eager, sdpa)")
def speed():
    src, dst = checkpoint("bert", "BertModel", BERT_BASE)
    for dtype in (torch.float32, torch.bfloat16):
        stock = transformers.BertModel.from_pretrained(src, dtype=dtype, attn_implementation="sdpa").to(CUDA).eval()
        model = ours("bert", "BertModel", dst, dtype=dtype, attn_implementation="sdpa").to(CUDA)
        for name, inputs in (("ragged 16 rows", ragged(stock.config.vocab_size, 0, 16, 16, 64 if QUICK else 512)),):
            tokens = int(inputs["attention_mask"].sum())
            with torch.no_grad():
                s, f = timed(lambda: stock(**inputs)), timed(lambda: model(**inputs))
            speed_rows.append((f"bert {name}, {str(dtype).removeprefix('torch.')}, sdpa", tokens / s, tokens / f))
    src, dst = checkpoint("gpt2", "GPT2LMHeadModel")
    stock = transformers.GPT2LMHeadModel.from_pretrained(src).to(CUDA).eval()
    model = ours("gpt2", "GPT2LMHeadModel", dst).to(CUDA)
    prompt = torch.randint(0, stock.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0)).to(CUDA)
    new = 8 if QUICK else 64
    greedy = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        s, f = timed(lambda: stock.generate(prompt, **greedy), 3), timed(lambda: model.generate(prompt, **greedy), 3)
    speed_rows.append(("gpt2 generate, batch 1, fp32", new / s, new / f))


print("\n## speed table (tokens/s)\n")
print("| what | stock | fivefold | ratio |\n|---|---|---|---|")
for what, s, f in speed_rows:
    print(f"| {what} | {s:,.0f} | {f:,.0f} | {f / s:.2f}x |")
@section("7. experts in CPU memory under cuda:0: the expert cache, and computing where the expert lives")
def experts_on_cpu():
    from fivefold.modeling.expert_placement import DeviceCosts

    src, dst = checkpoint("mixtral", "MixtralForCausalLM")
    cls = architecture_for_model_type("mixtral").class_named("MixtralForCausalLM")
    config = cls.config_class.from_pretrained(dst)
    with torch.device("meta"):
        skeleton = cls(config)
    owners = [name for name, m in skeleton.named_modules() if list(m.parameters(recurse=False))]
    device_map = {name: ("cpu" if ".experts." in name and int(name.split(".experts.")[1].split(".")[0]) % 2 else 0)
                  for name in owners}
    whole = cls.from_pretrained(dst).to(CUDA).eval()
    ids = torch.randint(5, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)).to(CUDA)
    greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected_logits, expected = whole(ids).logits, whole.generate(ids, **greedy)
    # The measured default, then each path forced: always moved (a CPU too slow), always on the CPU (no transfer).
    for label, costs in (("default costs", None), ("always moved", DeviceCosts(cpu_flops=1.0)),
                         ("always on the CPU", DeviceCosts(transfer_bytes=1.0))):
        model = cls.from_pretrained(dst, device_map=device_map, expert_cache_bytes=0).eval()
        if costs is not None:
            model.expert_cache.costs = costs
        with torch.no_grad():
            check(f"logits, experts on cpu, {label}", (model(ids).logits - expected_logits).abs().max().item(), 1e-4)
            model.expert_cache.reset_stats()
            seconds = timed(lambda: model.generate(ids, **greedy), runs=3)
            same = torch.equal(model.generate(ids, **greedy), expected)
        stats = model.expert_cache.stats
        print(f"{'ok  ' if same else 'FAIL'} {label}: greedy identical {same}; {seconds * 1e3:.1f} ms for 8 tokens;"
              f" CPU calls {stats.cpu_calls} of {stats.misses} misses")
        if not same:
            failures.append(f"experts on cpu, {label}")


REDUCED_MIXTRAL = dict(vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=4,
                       num_attention_heads=16, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2)


def bitsandbytes_on_experts(bits: int, loaders: dict, cls, ids: torch.Tensor, error, experts: int) -> None:
    """One bit width of section 8 (below, which runs as it is defined), a function so that its models are freed
    when it returns."""
    from fivefold.modeling.quantization import is_quantized_weight, quantized_modules

    def bnb(**skip):
        four = {"bnb_4bit_quant_type": "nf4"} if bits == 4 else {}
        return transformers.BitsAndBytesConfig(load_in_8bit=bits == 8, load_in_4bit=bits == 4, **four, **skip)

    models = {who: load(quantization_config=bnb(), device_map={"": 0}) for who, load in loaders.items()}
    names = {who: quantized_modules(m) for who, m in models.items()}
    for who, model in models.items():
        print(f"{bits}-bit {who}: {len(names[who])} modules quantized, "
              f"{sum('.experts.' in n for n in names[who])} of them experts' linears; max abs diff from fp32 "
              f"{error(model):.3f}; {model.get_memory_footprint() / 2**20:,.1f} MiB on the GPU")
    every = sum(".experts." in n for n in names["fivefold"]) == experts
    stock_fused = any(is_quantized_weight(p) for n, p in models["stock"].named_parameters() if ".experts." in n)
    print(f"{'ok  ' if every and not stock_fused else 'FAIL'} {bits}-bit: fivefold quantized all {experts} expert "
          f"linears: {every}; stock quantized its fused experts: {stock_fused}")
    if not every or stock_fused:
        failures.append(f"{bits}-bit: the experts quantized are not fivefold's all and stock's none")
    # Where both quantize the same modules (the attention), fivefold's error within 1.5x stock's.
    skip = bnb(llm_int8_skip_modules=[r".*\.experts", "lm_head"])
    attention_only = loaders["fivefold"](quantization_config=skip, device_map={"": 0})
    if len(quantized_modules(attention_only)) != len(names["stock"]):
        failures.append(f"{bits}-bit: the attention alone is not what stock quantizes")
    check(f"{bits}-bit, the attention alone: fivefold's error / stock's",
          error(attention_only) / max(error(models["stock"]), 1e-12), 1.5)
    quantized = models["fivefold"]
    greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        out = quantized.generate(ids, **greedy)
        quantized.save_pretrained(folder)
        again = cls.from_pretrained(folder, device_map={"": 0}).eval()
        check(f"{bits}-bit saved and reloaded vs before", (again(ids).logits - quantized(ids).logits).abs().max().item(), 0)
        same = torch.equal(again.generate(ids, **greedy), out)
    print(f"{'ok  ' if same else 'FAIL'} {bits}-bit generate {tuple(out.shape)}; the reloaded model's the same: {same}")
    if not same:
        failures.append(f"{bits}-bit: the reloaded model generates differently")


@section("8. bitsandbytes (8-bit, NF4) on cuda:0: every expert of Mixtral quantized, where stock's fused experts stay fp32")
def bitsandbytes_experts():
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        print("skipped: the bitsandbytes package is not installed")
        return
    src, dst = checkpoint("mixtral", "MixtralForCausalLM", REDUCED_MIXTRAL)
    cls = architecture_for_model_type("mixtral").class_named("MixtralForCausalLM")
    loaders = {"stock": lambda **kw: transformers.MixtralForCausalLM.from_pretrained(src, **kw).eval(),
               "fivefold": lambda **kw: cls.from_pretrained(dst, **kw).eval()}
    config = cls.config_class.from_pretrained(dst)
    experts = config.num_hidden_layers * config.num_local_experts * 3  # gate, up and down of each
    ids = torch.randint(5, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)).to(CUDA)
    with torch.no_grad():
        exact = loaders["stock"]().to(CUDA)(ids).logits.float()  # the fp32 model is freed once this is computed

    def error(model) -> float:
        with torch.no_grad():
            return (model(ids).logits.float() - exact).abs().max().item()

    for bits in (8, 4):
        bitsandbytes_on_experts(bits, loaders, cls, ids, error, experts)
        torch.cuda.empty_cache()


print(f"\nfailed: {failures}" if failures else "\nall checks passed")
sys.exit(1 if failures else 0)
PY

echo
echo "## 4. expert parallelism with nccl at world size 1"
if [[ -f benchmarks/distributed.py ]]; then
    args=(--backend nccl)
    [[ $QUICK == 1 ]] && args+=(--quick)
    python benchmarks/distributed.py "${args[@]}" || { echo "FAILED: expert parallelism with nccl"; status=1; }
else
    echo "skipped: benchmarks/distributed.py (issue 13) is not in this checkout"
fi
exit $status
