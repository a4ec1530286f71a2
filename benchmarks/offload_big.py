"""A model whose weights are larger than the machine's memory generates: a Mixtral-shaped model of ~30 GB in fp32
(hidden 2048, 8 experts of width 7168, top-2, 20 layers, vocab 32000) on a 24 GB machine, in a memory cgroup of a
few GB.

Three steps, the last two each in a fresh process inside a memory cgroup this script creates (benchmarks/offload.py's),
so that every memory figure is a peak cgroup charge:

1. build: a stock checkpoint in the public Hub layout (per-expert `w1`/`w2`/`w3`), written one layer per safetensors
   shard with random weights (fixed seed): one layer in memory at a time;
2. convert: `fivefold.convert`, which streams the checkpoint shard by shard (its peak charge, cgroup limited to
   --convert-limit);
3. generate: `FivefoldMixtralForCausalLM.from_pretrained(..., device_map="auto", max_memory={"cpu": budget})`, the
   experts read from the converted checkpoint through the expert cache, greedy tokens from a short prompt, the
   cgroup limited to the budget + --slack.

Reported: sizes, each step's time and peak charge, tokens/s (the prompt's prefill apart), bytes read from disk per
token, the cache's hit rate, and the disk's cold sequential read bandwidth.

    python benchmarks/offload_big.py --folder /var/tmp/big   # as root; ~60 GB of disk, tens of minutes
    python benchmarks/offload_big.py --quick                  # a 25 MB model, seconds
"""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from cgroup import MemoryCgroup, cgroups_available, disk_bandwidth, drop_from_page_cache, read_bytes
from harness import command_line, machine_line, parse, python, table, write_report
from offload import expert_bytes
from safetensors.torch import save_file

BIG = dict(
    vocab_size=32000, hidden_size=2048, intermediate_size=7168, num_local_experts=8, num_experts_per_tok=2,
    num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=4096,
)  # fmt: skip
QUICK = dict(
    vocab_size=512, hidden_size=64, intermediate_size=256, num_local_experts=8, num_experts_per_tok=2,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)  # fmt: skip
MB, GB = 1e6, 1e9


def layer_tensors(config: transformers.MixtralConfig, i: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Layer i of a Mixtral in the Hub layout, random weights (std 0.02, a sharper router)."""
    c, f, e = config.hidden_size, config.intermediate_size, config.num_local_experts
    kv = config.num_key_value_heads * (c // config.num_attention_heads)
    p = f"model.layers.{i}."

    def w(*shape, std=0.02):
        return torch.empty(shape).normal_(0.0, std, generator=gen)

    tensors = {p + "input_layernorm.weight": torch.ones(c), p + "post_attention_layernorm.weight": torch.ones(c)}
    for name, rows in (("q", c), ("k", kv), ("v", kv), ("o", c)):
        tensors[f"{p}self_attn.{name}_proj.weight"] = w(rows, c)
    tensors[p + "block_sparse_moe.gate.weight"] = w(e, c, std=0.5)
    for x in range(e):
        q = f"{p}block_sparse_moe.experts.{x}."
        tensors |= {q + "w1.weight": w(f, c), q + "w3.weight": w(f, c), q + "w2.weight": w(c, f)}
    return tensors


def build(fields: dict, folder: Path) -> float:
    """Writes the stock checkpoint, shard by shard; seconds taken."""
    start = time.perf_counter()
    config = transformers.MixtralConfig(**fields, tie_word_embeddings=False)
    config.architectures = ["MixtralForCausalLM"]
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    gen = torch.Generator().manual_seed(0)
    shards = config.num_hidden_layers + 1
    weight_map, total = {}, 0
    for s in range(shards):
        if s < config.num_hidden_layers:
            tensors = layer_tensors(config, s, gen)
        else:
            v, c = config.vocab_size, config.hidden_size
            embed = torch.empty(v, c).normal_(0.0, 0.02, generator=gen)
            head = torch.empty(v, c).normal_(0.0, 0.02, generator=gen)
            tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(c), "lm_head.weight": head}
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, folder / name, metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map |= dict.fromkeys(tensors, name)
        del tensors
        print(f"built shard {s + 1}/{shards}", file=sys.stderr, flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return time.perf_counter() - start


def convert_child(job: dict) -> dict:
    import fivefold

    start = time.perf_counter()
    fivefold.convert(job["stock"], job["fivefold"], progress=False)
    return {"seconds": time.perf_counter() - start}


class Clock(transformers.StoppingCriteria):
    """Never stops generation: records (seconds, bytes read from disk) after each step, and resets the cache's
    counters after the first (the prompt's prefill)."""

    def __init__(self, cache):
        self.cache, self.marks = cache, []

    def __call__(self, input_ids, scores, **kwargs):
        self.marks.append((time.perf_counter(), read_bytes()))
        if len(self.marks) == 1:
            self.cache.reset_stats()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def generate_child(job: dict) -> dict:
    torch.set_num_threads(job["threads"])
    transformers.utils.logging.set_verbosity_error()
    import fivefold

    start = time.perf_counter()
    model = fivefold.FivefoldMixtralForCausalLM.from_pretrained(
        job["fivefold"], device_map="auto", max_memory={"cpu": job["budget"]}
    ).eval()
    load = time.perf_counter() - start
    prompt = torch.randint(3, model.config.vocab_size, (1, job["prompt"]), generator=torch.Generator().manual_seed(0))
    clock = Clock(model.expert_cache)
    new = job["new"]
    with torch.no_grad():
        start, io = time.perf_counter(), read_bytes()
        tokens = model.generate(
            prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, stopping_criteria=[clock]
        )
    (first, first_io), (last, last_io) = clock.marks[0], clock.marks[-1]
    steps = len(clock.marks) - 1  # the tokens after the first, each one step of one token
    return {
        "load_s": load, "prefill_s": first - start, "prefill_read": first_io - io,
        "tok_s": steps / (last - first), "read_per_token": (last_io - first_io) / steps,
        "hit_rate": model.expert_cache.stats.hit_rate, "cache_budget": model.expert_cache.budget,
        "tokens": tokens[0, job["prompt"] :].tolist(),
    }  # fmt: skip


def in_cgroup(step: str, job: dict, limit: int | None) -> dict:
    """A child step in a fresh process inside a memory cgroup (none when not root): its result and peak charge."""
    command = [python(), __file__, "--child", step, json.dumps(job)]
    group = MemoryCgroup(f"fivefold-big-{step}-{time.monotonic_ns()}", limit) if cgroups_available() else None
    prefix = f"echo $$ > {group.path / 'cgroup.procs'} && exec " if group else "exec "
    try:
        done = subprocess.run(["sh", "-c", prefix + " ".join(map(repr, command))], capture_output=True, text=True)
        peak = group.peak() if group else None
    finally:
        if group:
            group.remove()
    if done.returncode:
        raise SystemExit(f"{step} failed: {done.stderr.strip()[-2000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "peak": peak}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        step = {"convert": convert_child, "generate": generate_child}[sys.argv[2]]
        print(json.dumps(step(json.loads(sys.argv[3]))))
        return
    parser = command_line(__doc__)
    parser.add_argument("--folder", help="where to build (needs twice the model's size free; default: a temp dir)")
    parser.add_argument("--budget", type=float, default=4.0, help="GB of max_memory for the generation (default 4)")
    parser.add_argument("--slack", type=float, default=0.7, help="GB of cgroup limit above the budget (default 0.7)")
    parser.add_argument("--convert-limit", type=float, default=8.0, help="GB cgroup limit of the conversion")
    parser.add_argument("--new", type=int, default=8, help="tokens generated (default 8)")
    args = parse(parser)
    fields = QUICK if args.quick else BIG
    experts, others = expert_bytes(transformers.MixtralForCausalLM, fields)
    budget = int(others + 0.25 * experts) if args.quick else int(args.budget * GB)
    root = Path(args.folder or tempfile.mkdtemp(prefix="fivefold-big-"))
    stock, ours = root / "stock", root / "fivefold"
    try:
        built = build(fields, stock)
        converted = in_cgroup("convert", {"stock": str(stock), "fivefold": str(ours)}, int(args.convert_limit * GB))
        bandwidth = disk_bandwidth(ours)
        drop_from_page_cache(ours)
        job = dict(fivefold=str(ours), budget=budget, prompt=8, new=args.new, threads=torch.get_num_threads())
        got = in_cgroup("generate", job, int(budget + args.slack * GB))
    finally:
        if args.folder is None:
            shutil.rmtree(root, ignore_errors=True)

    def peak(result):
        return "no cgroup" if result["peak"] is None else f"{result['peak'] / GB:.2f}"

    total = experts + others
    memory = Path("/proc/meminfo").read_text().split()[1]
    convert_row = [
        "convert (streaming)",
        f"{converted['seconds']:.1f}",
        f"{args.convert_limit:.2f}",
        peak(converted),
        "",
        "",
        "",
    ]
    generate_row = [
        f"generate {job['new']} tokens (prompt of {job['prompt']})",
        f"{got['load_s'] + got['prefill_s']:.1f}",
        f"{(budget + args.slack * GB) / GB:.2f}",
        peak(got),
        f"{got['tok_s']:.3f}",
        f"{got['read_per_token'] / GB:.2f}",
        f"{got['hit_rate']:.0%}",
    ]
    header = [
        "step",
        "seconds (load + prompt)",
        "cgroup limit GB",
        "peak charge GB",
        "tokens/s",
        "GB read a token",
        "cache hit rate",
    ]
    lines = [
        machine_line(f"cgroup: {'yes' if cgroups_available() else 'NO (needs root)'}; RAM {int(memory) / 1e6:.1f} GB"),
        "",
        f"Mixtral-shaped, fp32: {total / GB:.3g} GB ({experts / GB:.3g} GB of experts, {others / GB:.3g} GB the rest);"
        f" built in {built:.0f} s; disk {bandwidth / MB:,.0f} MB/s cold sequential read; generation with max_memory"
        f" {budget / GB:.3g} GB (expert cache {got['cache_budget'] / GB:.3g} GB): load {got['load_s']:.1f} s, prompt"
        f" {got['prefill_s']:.1f} s ({got['prefill_read'] / GB:.1f} GB read)",
        "",
        *table(header, [convert_row, generate_row]),
        "",
        f"tokens: {got['tokens']}",
    ]
    write_report(lines, args.out, args.json)


if __name__ == "__main__":
    main()
