"""Charts for the docs site from benchmark results in JSON: the speed of fivefold (and of ONNX Runtime, where a
result has it) relative to stock transformers, one bar per benchmark, coloured by architecture.

    python benchmarks/charts.py RESULTS.json [MORE.json ...] --out docs/assets/benchmarks

The input format (one file or several, their results put together):

    {"source": "...", "machine": "...",
     "results": [{"architecture": "BERT", "benchmark": "bert-base, full batch 8 x 128",
                  "unit": "tokens/s", "higher_is_better": true,
                  "stock": 1133, "fivefold": 2251, "onnxruntime": 2400}, ...]}

`onnxruntime` is optional. A ratio is fivefold / stock for rates (higher is better) and stock / fivefold for
times, so that above 1 always means faster than stock.
"""

import argparse
import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RUNTIMES = {"fivefold": "fivefold", "onnxruntime": "ONNX Runtime"}


def speedup(result: dict, runtime: str) -> float | None:
    """How many times faster than stock `runtime` ran this benchmark (None: not measured)."""
    value = result.get(runtime)
    if value is None:
        return None
    return value / result["stock"] if result["higher_is_better"] else result["stock"] / value


def read(paths: list[Path]) -> tuple[list[dict], list[str]]:
    results, machines = [], []
    for path in paths:
        data = json.loads(path.read_text())
        for result in data["results"]:
            missing = {"architecture", "benchmark", "higher_is_better", "stock", "fivefold"} - result.keys()
            if missing:
                raise ValueError(f"{path}: a result lacks {sorted(missing)}: {result}")
        results += data["results"]
        machines.append(data.get("machine", "unknown machine"))
    return results, machines


def chart(results: list[dict], machines: list[str], path: Path) -> None:
    runtimes = [r for r in RUNTIMES if any(speedup(result, r) is not None for result in results)]
    architectures = list(dict.fromkeys(result["architecture"] for result in results))
    colours = {a: plt.cm.tab10(i) for i, a in enumerate(architectures)}
    height = 0.8 / len(runtimes)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(results) + 1.5))
    for k, runtime in enumerate(runtimes):
        for i, result in enumerate(results):
            ratio = speedup(result, runtime)
            if ratio is None:
                continue
            y = i + (k - (len(runtimes) - 1) / 2) * height
            ax.barh(y, ratio, height, color=colours[result["architecture"]], hatch="//" if k else None)
            ax.text(ratio, y, f" {ratio:.2f}x", va="center", fontsize=7)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlim(0, 1.15 * max(speedup(r, k) or 0 for r in results for k in runtimes))
    ax.set_yticks(range(len(results)), [result["benchmark"] for result in results], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speed relative to stock transformers (above 1: faster)")
    label = " and ".join(RUNTIMES[r] for r in runtimes)
    # The machine and versions once: each script's line goes on with its own details after the second "; ".
    where = "; ".join(dict.fromkeys("; ".join(m.split("; ")[:2]) for m in machines))
    ax.set_title(textwrap.fill(f"{label} vs stock ({where})", 75), fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[a]) for a in architectures]
    names = list(architectures)
    for runtime in runtimes[1:]:  # the hatched bars
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch="//"))
        names.append(RUNTIMES[runtime])
    ax.legend(handles, names, fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the long benchmark names stay inside the picture
    plt.close(fig)


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", type=Path, help="benchmark results (JSON, the format above)")
    p.add_argument("--out", type=Path, default=Path("docs/assets/benchmarks"), help="folder for the PNG charts")
    args = p.parse_args(argv)
    results, machines = read(args.results)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "speedup.png"
    chart(results, machines, path)
    print(path)
    return path


if __name__ == "__main__":
    main()
