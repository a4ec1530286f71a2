"""Expert parallelism: a reduced Mixtral on 1 process against 2 (fivefold's all-to-all, stock's masked all-reduce).

The reduced Mixtral (hidden 1024, intermediate 3584, 8 experts, top-2, 4 layers, Mixtral-8x7B's other fields) is
saved once as a random stock checkpoint and converted. Three contenders load it, each in its own `torchrun`
launch: fivefold in one process, fivefold with `DistributedConfig(ep_size=2, fsdp_size=2)`, and stock
`MixtralForCausalLM` with the same config. Every rank runs its own batch: prefill of 4 x 128 tokens and greedy
generation (`synced_gpus=True`), timed alternately in runs; tokens/s counts every rank's tokens. Also per rank:
peak RSS after loading and the first forward, and the bytes this rank hands to torch.distributed's collectives in
one prefill (the Python-level calls: all-to-all, all-reduce, all-gather, reduce-scatter, broadcast, counted by
wrapping them; FSDP2's parameter gathers included). On a 2-core machine speed cannot grow with processes: the
figures say what the exchange costs. `--backend nccl` runs the same on GPUs (one per rank; a contender needing more
GPUs than the machine has gets a row saying so).
"""

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from harness import checkpoints, command_line, machine_line, parse, python, size, table, write_report
from transformers.distributed import DistributedConfig

import fivefold

REDUCED = dict(
    hidden_size=1024, intermediate_size=3584, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=4
)
CONTENDERS = {  # name -> (processes, which model, distributed)
    "fivefold, 1 process": (1, "fivefold", False),
    "fivefold EP, 2 processes": (2, "fivefold", True),
    "stock EP, 2 processes": (2, "stock", True),
}


def count_collectives() -> dict[str, int]:
    """Wraps the collectives (where torch and transformers call them) to add up the bytes of their inputs."""
    import torch.distributed._functional_collectives as functional
    from transformers.distributed import expert_parallel

    sent = {"bytes": 0}
    names = ["all_to_all_single", "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"]
    names += ["all_to_all_single_autograd", "all_gather_tensor"]
    output_first = {"all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor"}  # c10d's (out, in)
    for module in (dist, functional, expert_parallel):
        for name in names:
            real = getattr(module, name, None)
            if real is None:
                continue
            position = 1 if name in output_first and module is not functional else 0

            def counted(*args, _real=real, _position=position, **kwargs):
                tensor = args[_position]
                if torch.is_tensor(tensor):
                    sent["bytes"] += tensor.numel() * tensor.element_size()
                return _real(*args, **kwargs)

            setattr(module, name, counted)
    return sent


def worker(
    kind: str, folder: Path, distributed: bool, backend: str, runs: int, new_tokens: int, threads: int | None
) -> None:
    """One rank of one contender: writes its figures to folder/<kind>-<rank>.json. Without --threads the ranks
    share the machine's cores."""
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // int(os.environ.get("WORLD_SIZE", 1))))
    transformers.utils.logging.set_verbosity_error()
    kwargs = {}
    if distributed:
        dist.init_process_group(backend)
        world, rank = dist.get_world_size(), dist.get_rank()
        kwargs["distributed_config"] = DistributedConfig(ep_size=world, fsdp_size=world)
    else:
        world, rank = 1, 0
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    if kind == "stock":
        model = transformers.MixtralForCausalLM.from_pretrained(folder / "stock", **kwargs)
    else:
        model = fivefold.FivefoldMixtralForCausalLM.from_pretrained(folder / "fivefold", **kwargs)
    model = model.eval() if distributed else model.to(device).eval()
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (4, 128), generator=torch.Generator().manual_seed(rank)).to(device)
    sent = count_collectives()
    with torch.no_grad():
        model(input_ids=ids)  # the first forward: every weight this rank holds touched
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        sent["bytes"] = 0
        model(input_ids=ids)
        exchanged = sent["bytes"]
        timings = {"prefill": [], "generate": []}
        for _ in range(runs):
            for what in timings:
                if distributed:
                    dist.barrier()
                start = time.perf_counter()
                if what == "prefill":
                    model(input_ids=ids)
                else:
                    model.generate(
                        ids,
                        max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens,
                        do_sample=False,
                        synced_gpus=distributed,
                        pad_token_id=0,
                    )
                if backend == "nccl":
                    torch.cuda.synchronize()
                timings[what].append(time.perf_counter() - start)
    figures = {"rss_mib": peak, "bytes": exchanged, "world": world, **timings}
    (folder / f"{kind}-{distributed}-{rank}.json").write_text(json.dumps(figures))
    if distributed:
        dist.barrier()  # a rank tearing gloo down while its peer still waits on it aborts the peer
        dist.destroy_process_group()
        # Every rank's figures are written: end without the interpreter's teardown, where freeing gloo's threads has
        # aborted a rank now and then ("terminate called without an active exception"; tests/workers/gloo_worker.py).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(kind: str, processes: int, distributed: bool, folder: Path, args) -> list[dict]:
    command = [python(), "-m", "torch.distributed.run", f"--nproc_per_node={processes}"]
    command += [f"--master_port={free_port()}", __file__, "--worker", kind, str(folder), str(distributed)]
    command += ["--backend", args.backend, "--runs", str(args.runs), "--new-tokens", str(args.new_tokens)]
    command += ["--threads", str(args.threads)] if args.threads else []
    subprocess.run(command, check=True)
    return [json.loads((folder / f"{kind}-{distributed}-{r}.json").read_text()) for r in range(processes)]


def row(name: str, ranks: list[dict]) -> list[str]:
    def rate(what: str, tokens: int) -> str:
        slowest = [max(r[what][i] for r in ranks) for i in range(len(ranks[0][what]))]  # the run ends with the last
        return f"{tokens * len(ranks) / sorted(slowest)[len(slowest) // 2]:.0f}"

    generated = ranks[0]["new_tokens"] * 4
    return [
        name,
        rate("prefill", 4 * 128),
        rate("generate", generated),
        " / ".join(f"{r['rss_mib']:.0f}" for r in ranks),
        " / ".join(f"{r['bytes'] / 2**20:.1f}" for r in ranks),
    ]


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="nccl: one GPU per rank")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per row (default 16, 2 --quick)")
    parser.add_argument("--worker", nargs=3, metavar=("KIND", "FOLDER", "DISTRIBUTED"), help=argparse.SUPPRESS)
    args = parse(parser)
    if args.new_tokens is None:
        args.new_tokens = 2 if args.quick else 16
    if args.worker:
        kind, folder, distributed = args.worker
        worker(kind, Path(folder), distributed == "True", args.backend, args.runs, args.new_tokens, args.threads)
        return
    fields, name = size("mixtral", "mistralai/Mixtral-8x7B-v0.1", args.quick)
    if not args.quick:
        fields = {**fields, **REDUCED}
        name = "reduced Mixtral (hidden 1024, intermediate 3584, 8 experts, top-2, 4 layers)"
    rows = []
    with checkpoints(transformers.MixtralForCausalLM, fields) as found:
        folder = found.stock_dir.parent
        gpus = torch.cuda.device_count() if args.backend == "nccl" else None
        for contender, (processes, kind, distributed) in CONTENDERS.items():
            if gpus is not None and processes > gpus:  # nccl takes one GPU per rank
                rows.append([contender, f"needs {processes} GPUs, found {gpus}", "", "", ""])
                continue
            ranks = launch(kind, processes, distributed, folder, args)
            for r in ranks:
                r["new_tokens"] = args.new_tokens
            rows.append(row(contender, ranks))
    header = ["contender", "prefill tok/s", "generate tok/s", "peak RSS per rank (MiB)", "sent per prefill (MiB)"]
    details = (
        f"{name}; backend {args.backend}; batch 4 x 128 per rank; {args.new_tokens} new tokens; median of {args.runs}"
    )
    write_report([machine_line(details), "", *table(header, rows)], args.out, args.json)


if __name__ == "__main__":
    main()
