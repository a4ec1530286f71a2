"""Experts bigger than memory: stock's device_map offload against fivefold's expert cache, each contender in a fresh
process inside a memory cgroup this script creates, so that every memory figure is a peak cgroup charge and every
read that the limit pushes out of the page cache really reaches the disk.

The reduced Mixtral (hidden 1024, 8 experts of width 3584, top-2, 4 layers, fp32: 1.6 GB), and a reduced
Qwen3-MoE of the same sizes (whose stock experts are one fused module per layer, so that stock's device map can
only offload a layer's experts whole), at two budgets, about a quarter and about half of the experts resident
(`max_memory` = the always-resident parts + that share of the experts; the cgroup limit = `max_memory` + `--slack`
for the interpreter and libraries), with two routers: stock's random init (close to uniform routing) and a skewed
one whose router rows are scaled by a Zipf law, (e + 1) ** -1: expert popularity in trained MoEs is long-tailed (a
few experts take most tokens, as measured on Mixtral and DeepSeek-MoE), and a Zipf law with exponent 1 is the
simplest such tail. Contenders: stock with `device_map="auto"` + `max_memory` + `offload_folder`; fivefold with the
cache off (`expert_cache_bytes=0`), with the cache (its default budget, LRU), with the frequency eviction, with
cache and prefetch; the whole model in memory (no limit) as the ceiling. Each greedily generates 32 tokens from a
32-token prompt and runs a 4 x 128 prefill.

Reported: tokens/s, peak cgroup charge, bytes read from disk per generated token (`/proc/self/io`), hit rate,
prefetch accuracy, load time, bytes written at load (the offload folder), whether the tokens are the ceiling's and
the largest logit difference, and the floor: per token, the bytes fivefold's cache read at the disk bandwidth
measured in this run, overlapped with the in-memory compute (the ceiling's time per token).

    python benchmarks/offload.py            # as root, on a quiet machine: about 20 minutes on 2 cores
    python benchmarks/offload.py --models mixtral   # one of them
    python benchmarks/offload.py --int8     # also each model quantized (torchao int8), its experts read in int8
    python benchmarks/offload.py --nf4      # also each model in bitsandbytes NF4, its experts read in 4 bits
    python benchmarks/offload.py --nf4 --quantized-only  # those rows alone
    python benchmarks/offload.py --quick    # tiny sizes, one router, one budget, one fresh process: a smoke test
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from cgroup import MemoryCgroup, cgroups_available, disk_bandwidth, drop_from_page_cache, read_bytes
from harness import checkpoints, command_line, machine_line, parse, python, table, write_report

REDUCED = dict(
    vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_local_experts=8, num_experts_per_tok=2,
    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
)  # fmt: skip
QUICK = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_local_experts=8, num_experts_per_tok=2,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
)  # fmt: skip


def qwen3_moe(fields: dict) -> dict:
    """The same sizes in Qwen3-MoE's fields: every layer sparse, the top-k renormalised (as Mixtral's)."""
    renamed = {"intermediate_size": "moe_intermediate_size", "num_local_experts": "num_experts"}
    out = {renamed.get(k, k): v for k, v in fields.items()}
    return dict(out, head_dim=fields["hidden_size"] // fields["num_attention_heads"], norm_topk_prob=True,
                decoder_sparse_step=1, mlp_only_layers=[])  # fmt: skip


# name: (stock class, fivefold class, fields from the Mixtral-named ones)
MODELS = {
    "mixtral": ("MixtralForCausalLM", "FivefoldMixtralForCausalLM", dict),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "FivefoldQwen3MoeForCausalLM", qwen3_moe),
}
CONTENDERS = {
    "stock": {},
    "fivefold, cache off": dict(expert_cache_bytes=0),
    "fivefold, cache": {},
    "fivefold, cache (frequency)": dict(expert_cache_eviction="frequency"),
    "fivefold, cache + prefetch": dict(expert_prefetch=True),
}
MB = 1e6


def zipf_router(model: transformers.PreTrainedModel) -> None:
    """Router rows scaled by (e + 1) ** -1: an expert with a larger row wins the top-k more often."""
    for layer in model.model.layers:
        scale = (torch.arange(layer.mlp.gate.weight.shape[0]) + 1.0) ** -1.0
        layer.mlp.gate.weight.normal_(0.0, 0.5).mul_(scale[:, None])


# --- one contender, in its own process ------------------------------------------------------------------------


def child(job: dict) -> dict:
    """Loads, generates and prefills as `job` says; what it measured."""
    torch.set_num_threads(job["threads"])
    transformers.utils.logging.set_verbosity_error()
    import fivefold  # registers fivefold's classes

    name = job["name"]
    kwargs = {} if job.get("max_memory") is None else dict(device_map="auto", max_memory={"cpu": job["max_memory"]})
    offload = Path(job["offload"])
    stock_name, fivefold_name, _ = MODELS[job["model"]]
    if name == "stock":
        cls, folder, kwargs["offload_folder"] = getattr(transformers, stock_name), job["stock"], offload
    else:
        cls, folder = getattr(fivefold, fivefold_name), job["fivefold"]
        kwargs.update(CONTENDERS.get(name, {}))
        if "max_memory" in job:
            kwargs["offload_folder"] = offload  # given, so that anything written would show
    start = time.perf_counter()
    model = cls.from_pretrained(folder, **kwargs).eval()
    load = time.perf_counter() - start
    written = sum(p.stat().st_size for p in offload.rglob("*") if p.is_file())
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, model.config.vocab_size, (1, job["prompt"]), generator=gen)
    batch = torch.randint(3, model.config.vocab_size, job["prefill"], generator=gen)
    with torch.no_grad():
        model.generate(prompt[:, :4], max_new_tokens=2, do_sample=False)  # warm-up: first calls, allocator
        cache = getattr(model, "expert_cache", None)
        if cache is not None:
            cache.reset_stats()
        io, start = read_bytes(), time.perf_counter()
        tokens = model.generate(prompt, max_new_tokens=job["new"], min_new_tokens=job["new"], do_sample=False)
        decode = time.perf_counter() - start
        io = read_bytes() - io
        stats = None if cache is None else cache.stats
        start = time.perf_counter()
        logits = model(batch).logits[:, -1]
        prefill = time.perf_counter() - start
    return {
        "load_s": load, "written": written, "tok_s": job["new"] / decode, "read_per_token": io / job["new"],
        "prefill_tok_s": batch.numel() / prefill, "tokens": tokens[0].tolist(), "logits": logits.tolist(),
        "hit_rate": None if stats is None else stats.hit_rate,
        "prefetch": None if stats is None or not stats.prefetched else stats.prefetch_accuracy,
        "cache_read_per_token": None if stats is None else stats.bytes_read / job["new"],
    }  # fmt: skip


def run_contender(job: dict, limit: int | None, use_cgroup: bool, fresh: bool = True) -> dict:
    """One contender's figures: in a fresh process inside a cgroup, or (`fresh=False`, --quick) in this one."""
    drop_from_page_cache(Path(job["stock"]))
    drop_from_page_cache(Path(job["fivefold"]))
    with tempfile.TemporaryDirectory() as tmp:
        job = {**job, "offload": tmp}
        if not fresh:
            return {**child(job), "peak": None}
        command = [python(), __file__, "--child", json.dumps(job)]
        group = MemoryCgroup(f"fivefold-offload-{os.getpid()}-{time.monotonic_ns()}", limit) if use_cgroup else None
        prefix = f"echo $$ > {group.path / 'cgroup.procs'} && exec " if group else "exec "
        try:
            done = subprocess.run(["sh", "-c", prefix + " ".join(map(repr, command))], capture_output=True, text=True)
            peak = group.peak() if group else None
            oom_killed = group is not None and group.oom_kills() > 0
        finally:
            if group:
                group.remove()
    if oom_killed:
        return {"error": f"killed by the cgroup's OOM killer at its {limit / MB:,.0f} MB limit"}
    if done.returncode:
        # The last line naming an error, not a warning printed after it.
        said = done.stderr.strip().splitlines()
        error = next((line for line in reversed(said) if "Error" in line), said[-1] if said else "")
        return {"error": f"exit {done.returncode}: {error[:120]}"}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "peak": peak}


# --- the report ---------------------------------------------------------------------------------------------------


def expert_bytes(stock_class: type[transformers.PreTrainedModel], fields: dict) -> tuple[int, int]:
    """(bytes of all the experts, bytes of everything else) of the fp32 stock model of these fields, counted on
    the meta device."""
    with torch.device("meta"):
        model = stock_class(stock_class.config_class(**fields))
    sizes = [(name, p.numel() * 4) for name, p in model.named_parameters()]
    experts = sum(size for name, size in sizes if ".experts." in name)
    return experts, sum(size for _, size in sizes) - experts


def row(name: str, got: dict, whole: dict) -> list[str]:
    if "error" in got:
        return [name, "failed: " + got["error"], *[""] * 9]
    same = got["tokens"] == whole["tokens"]
    diff = (torch.tensor(got["logits"]) - torch.tensor(whole["logits"])).abs().max().item()

    def share(value):
        return "" if value is None else f"{value:.0%}"

    return [
        name, f"{got['tok_s']:.2f}", f"{got['prefill_tok_s']:.0f}",
        "" if got["peak"] is None else f"{got['peak'] / MB:,.0f}", f"{got['read_per_token'] / MB:,.1f}",
        share(got["hit_rate"]), share(got["prefetch"]), f"{got['load_s']:.2f}", f"{got['written'] / MB:,.0f}",
        "yes" if same else "NO", f"{diff:.1e}",
    ]  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return
    parser = command_line(__doc__)
    parser.add_argument("--slack", type=float, default=700, help="MB of cgroup limit above max_memory (default 700)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--int8", action="store_true", help="also the model quantized to int8, experts read in int8")
    parser.add_argument("--nf4", action="store_true", help="also the model in bitsandbytes NF4, experts read in NF4")
    parser.add_argument("--quantized-only", action="store_true", help="the --int8 / --nf4 rows only, not fp32's")
    parser.add_argument("--routers", default="random,skewed", help="comma-separated, of random, skewed")
    args = parse(parser)
    if args.quantized_only and not (args.int8 or args.nf4):
        parser.error("--quantized-only runs the --int8 and --nf4 rows alone: name at least one of them")
    shape = dict(prompt=8, new=8, prefill=[2, 16]) if args.quick else dict(prompt=32, new=32, prefill=[4, 128])
    threads = torch.get_num_threads()
    use_cgroup = cgroups_available()
    capability = torch.backends.cpu.get_cpu_capability()  # the int8 rows' kernel depends on it (quantized.py)
    cgroup = "yes" if use_cgroup else "NO (needs root and a memory cgroup)"
    allocator = os.environ.get("MALLOC_MMAP_THRESHOLD_")  # glibc's: a fixed threshold returns freed blocks at once
    allocator = f"; MALLOC_MMAP_THRESHOLD_={allocator}" if allocator else ""
    lines = [machine_line(f"cgroup: {cgroup}; CPU capability {capability}{allocator}")]
    results = []
    for model_name in args.models.split(","):
        stock_name, _, named = MODELS[model_name]
        stock_class = getattr(transformers, stock_name)
        fields = named(QUICK if args.quick else REDUCED)
        experts, others = expert_bytes(stock_class, fields)
        lines += [
            "",
            f"{stock_name} {'tiny' if args.quick else 'reduced'}: experts {experts / MB:,.0f} MB, the rest"
            f" {others / MB:,.0f} MB; greedy {shape['new']} tokens from a {shape['prompt']}-token prompt, prefill"
            f" {shape['prefill']}.",
        ]
        results += model_rows(model_name, stock_class, fields, experts, others, shape, threads, use_cgroup, args, lines)
    write_report(lines, args.out, args.json, results)


def model_rows(model_name, stock_class, fields, experts, others, shape, threads, use_cgroup, args, lines) -> list:
    """Runs every contender on one model, router and budget; appends the tables to `lines`; the chart's rows."""
    header = ["contender", "tok/s", "prefill tok/s", "peak MB", "read MB/token", "hit rate", "prefetch right",
              "load s", "written MB", "tokens = whole", "max logit diff"]  # fmt: skip
    results = []
    routers = [(name, init) for name, init in (("random", None), ("skewed (Zipf)", zipf_router))
               if name.split()[0] in args.routers.split(",")]  # fmt: skip
    for router, init in routers[:1] if args.quick else routers:
        with checkpoints(stock_class, fields, init=init) as found:
            job = dict(stock=str(found.stock_dir), fivefold=str(found.fivefold_dir), threads=threads, **shape)
            job["model"] = model_name
            bandwidth = disk_bandwidth(found.fivefold_dir)
            whole = (
                {} if args.quantized_only else run_contender({**job, "name": "whole"}, None, use_cgroup, not args.quick)
            )
            if "error" in whole:
                raise SystemExit(f"the whole model failed: {whole['error']}")
            for resident in () if args.quantized_only else (0.5,) if args.quick else (0.25, 0.5):
                budget = int(others + resident * experts)
                limit = int(budget + args.slack * MB)
                # --quick: one contender in its own process and cgroup, the others in this one (a smoke test).
                runs = {
                    name: run_contender({**job, "name": name, "max_memory": budget}, limit, use_cgroup, fresh)
                    for name, fresh in zip(CONTENDERS, (not args.quick, True, *[not args.quick] * 3), strict=True)
                }
                cached = runs["fivefold, cache"]
                floor = max(1 / whole["tok_s"], (cached.get("cache_read_per_token") or 0) / bandwidth)
                lines += [
                    "",
                    f"{stock_class.__name__}, router {router}, {resident:.0%} of experts resident: max_memory"
                    f" {budget / MB:,.0f} MB, cgroup limit {limit / MB:,.0f} MB; disk {bandwidth / MB:,.0f} MB/s;"
                    f" floor {1 / floor:.2f} tok/s (the cache's bytes per token at that bandwidth, overlapped with"
                    " compute)",
                    "",
                ]
                rows = [row(name, got, whole) for name, got in runs.items()] + [row("whole in memory", whole, whole)]
                lines += table(header, rows)
                if "error" not in runs["stock"] and "error" not in cached:
                    results.append({
                        "architecture": model_name, "benchmark": f"decode, {router}, {resident:.0%} resident",
                        "unit": "tokens/s", "higher_is_better": True,
                        "stock": runs["stock"]["tok_s"], "fivefold": cached["tok_s"],
                    })  # fmt: skip
            for kind in [kind for kind in QUANTIZED if getattr(args, kind)]:
                lines += quantized_rows(
                    kind, found, job, router, (others, experts), bandwidth, use_cgroup, args, header
                )
    return results


def quantized_config(kind: str) -> transformers.TorchAoConfig | transformers.BitsAndBytesConfig:
    """The quantizer of the `--int8` and `--nf4` rows: torchao int8 weight-only, bitsandbytes NF4 (fp32 compute)."""
    if kind == "int8":
        from torchao.quantization import Int8WeightOnlyConfig

        return transformers.TorchAoConfig(Int8WeightOnlyConfig())
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )


QUANTIZED = {"int8": "torchao int8 weight-only", "nf4": "bitsandbytes NF4"}


def quantized_rows(
    kind: str,
    found,
    job: dict,
    router: str,
    fp32_sizes: tuple[int, int],
    bandwidth: float,
    use_cgroup: bool,
    args,
    header: list[str],
) -> list[str]:
    """The same model quantized (`kind`: int8 or nf4) and saved, its experts left in that checkpoint and read in their
    stored form when they run: at a quarter of its experts resident, and at the max_memory that keeps a quarter of
    the fp32 experts; against the quantized model whole in memory."""
    import fivefold
    from fivefold.modeling.quantized_experts import held_bytes

    others, experts = fp32_sizes
    folder = found.fivefold_dir.parent / kind
    cls = getattr(fivefold, MODELS[job["model"]][1])
    model = cls.from_pretrained(found.fivefold_dir, quantization_config=quantized_config(kind))
    model.save_pretrained(folder)
    sizes = [(name, held_bytes(p)) for name, p in model.named_parameters()]
    q_experts = sum(size for name, size in sizes if ".experts." in name)
    q_others = sum(size for _, size in sizes) - q_experts
    del model
    job = {**job, "fivefold": str(folder)}
    whole = run_contender({**job, "name": f"{kind} whole"}, None, use_cgroup, fresh=not args.quick)
    if "error" in whole:
        return ["", f"{kind}: the whole model failed: {whole['error']}"]
    budgets = {
        f"fivefold {kind}, cache, 25% of {kind} experts": int(q_others + 0.25 * q_experts),
        f"fivefold {kind}, cache, the fp32 25% budget": int(others + 0.25 * experts),
    }
    runs = {}
    for name, budget in budgets.items():
        limit = int(budget + args.slack * MB)
        runs[name] = run_contender({**job, "name": name, "max_memory": budget}, limit, use_cgroup)
    quarter = runs[f"fivefold {kind}, cache, 25% of {kind} experts"]
    floor = max(1 / whole["tok_s"], (quarter.get("cache_read_per_token") or 0) / bandwidth)
    lines = [
        "",
        f"{MODELS[job['model']][0]} {kind} ({QUANTIZED[kind]}, saved and loaded pre-quantized), router {router}:"
        f" experts {q_experts / MB:,.0f} MB, the rest {q_others / MB:,.0f} MB; max_memory"
        f" {', '.join(f'{b / MB:,.0f}' for b in budgets.values())} MB (cgroup limit + {args.slack:,.0f} MB);"
        f" floor at 25% {1 / floor:.2f} tok/s; tokens and logits against the {kind} model whole",
        "",
    ]
    rows = [row(name, got, whole) for name, got in runs.items()] + [row(f"{kind} whole in memory", whole, whole)]
    return lines + table(header, rows)


if __name__ == "__main__":
    main()
