"""torch.compile: compile time and compiled speed, fivefold vs stock transformers, on identical weights.

BERT-base (a full batch, 8 x 128) and GPT-2 124M (a prefill, 1 x 128) forwards, fp32, sdpa. Each model is compiled
with `torch.compile` the way its users would: stock with the defaults (graph breaks allowed), fivefold with
`fullgraph=True` (one graph, or the call fails). The compile time is the first compiled call minus an eager call;
the graphs are counted from dynamo's counters. Caches are off (dynamo reset, inductor's FX graph cache disabled)
so that neither contender reuses the other's work. Then eager and compiled calls are timed alternately; ratios
are stock / fivefold (above 1: fivefold faster).

    python benchmarks/compile.py                    # inductor, the public sizes
    python benchmarks/compile.py --runs 7 --threads 2 --out results.md --json results.json
    python benchmarks/compile.py --quick            # tiny models, the aot_eager backend: a smoke test
"""

import time

import torch
import transformers
from harness import alternate, checkpoints, command_line, machine_line, parse, size, table, write_report

MODELS = {  # name -> (stock class, model type, public checkpoint, batch shape, more inputs)
    "BERT": (transformers.BertModel, "bert", "google-bert/bert-base-uncased", (8, 128), {}),
    "GPT-2": (transformers.GPT2LMHeadModel, "gpt2", "openai-community/gpt2", (1, 128), {"use_cache": False}),
}


def graphs_so_far() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def compiled(model, inputs: dict, backend: str, fullgraph: bool) -> tuple[object, float, int]:
    """The compiled model, the seconds its first call took beyond an eager call, and the graphs it made."""
    with torch.no_grad():
        start = time.perf_counter()
        model(**inputs)
        eager = time.perf_counter() - start
        fast = torch.compile(model, backend=backend, fullgraph=fullgraph)
        before = graphs_so_far()
        start = time.perf_counter()
        fast(**inputs)
        first = time.perf_counter() - start
    return fast, first - eager, graphs_so_far() - before


def bench(name: str, args) -> tuple[list[list[str]], list[dict]]:
    stock_class, model_type, hub_id, (batch, length), more = MODELS[name]
    fields, label = size(model_type, hub_id, args.quick)
    if args.quick:
        batch, length = 2, 16
    with checkpoints(stock_class, fields) as found:
        ids = torch.randint(5, fields["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(0))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **more}
        models = {"stock": found.load_stock(attn_implementation="sdpa")}
        models["fivefold"] = found.load_fivefold(attn_implementation="sdpa")
        made = {
            who: compiled(model, inputs, args.backend, fullgraph=who == "fivefold") for who, model in models.items()
        }
        contenders = {}
        for who, model in models.items():
            contenders[who, "eager"] = model
            contenders[who, "compiled"] = made[who][0]

        def call(model):
            def run():
                with torch.no_grad():
                    return model(**inputs)

            return run

        timings = alternate({key: call(model) for key, model in contenders.items()}, args.runs)
        with torch.no_grad():
            first = {who: made[who][0](**inputs)[0] for who in models}
        diff = float((first["stock"] - first["fivefold"]).abs().max())
    ms = {key: t.median * 1e3 for key, t in timings.items()}
    rows = [
        [
            f"{name} ({label}), {batch} x {length}",
            who,
            f"{made[who][2]}",
            f"{made[who][1]:.1f}",
            f"{ms[who, 'eager']:.1f}",
            f"{ms[who, 'compiled']:.1f}",
            f"{ms['stock', 'compiled'] / ms[who, 'compiled']:.2f}x",
            f"{diff:.1e}" if who == "fivefold" else "-",
        ]
        for who in models
    ]
    results = [
        {
            "architecture": name,
            "benchmark": f"{label}, compiled forward {batch} x {length}",
            "unit": "ms",
            "higher_is_better": False,
            "stock": ms["stock", "compiled"],
            "fivefold": ms["fivefold", "compiled"],
        },
        {
            "architecture": name,
            "benchmark": f"{label}, compile time",
            "unit": "s",
            "higher_is_better": False,
            "stock": made["stock"][1],
            "fivefold": made["fivefold"][1],
        },
    ]
    return rows, results


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--backend", help="torch.compile backend (default inductor, aot_eager --quick)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parse(parser)
    args.backend = args.backend or ("aot_eager" if args.quick else "inductor")
    # Each contender compiles from nothing: no FX graph or AOTAutograd cache from an earlier run or the other one.
    torch._inductor.config.fx_graph_cache = False
    if hasattr(torch._functorch.config, "enable_autograd_cache"):
        torch._functorch.config.enable_autograd_cache = False
    torch._dynamo.reset()
    # The first compile of a process also pays for loading the backend and its toolchain: paid here, by neither.
    torch.compile(lambda x: torch.nn.functional.gelu(x @ x) + 1, backend=args.backend)(torch.ones(8, 8))
    header = ["model, batch", "contender", "graphs", "compile s", "eager ms", "compiled ms",
              "compiled: stock / contender", "max abs diff vs stock (compiled)"]  # fmt: skip
    rows, results = [], []
    for name in args.models:
        more_rows, more_results = bench(name, args)
        rows += more_rows
        results += more_results
    sizes = " (--quick sizes)" if args.quick else ""
    lines = [
        machine_line(f"fp32, sdpa, backend {args.backend}, median of {args.runs}{sizes}"),
        "",
        *table(header, rows),
        "",
        "compile s: the first compiled call minus an eager call (dynamo, AOTAutograd and the backend's code "
        "generation). stock: torch.compile defaults; fivefold: fullgraph=True.",
    ]
    write_report(lines, args.out, args.json, results)


if __name__ == "__main__":
    main()
