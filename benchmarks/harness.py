"""What every benchmark script shares: the command line, the sizes from the architecture table, a random stock
checkpoint and its conversion, alternate timing, and the markdown report with its machine line."""

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import transformers

import fivefold
from fivefold.architectures import architecture_for_model_type

QUICK_RUNS = 2
RUNS = 5

Key = TypeVar("Key")


def command_line(doc: str) -> argparse.ArgumentParser:
    """The options every script takes; a script adds its own before calling `parse`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=int, help=f"timed runs of each contender (default {RUNS}, {QUICK_RUNS} --quick)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script in seconds")
    parser.add_argument("--out", help="also write the markdown report here")
    parser.add_argument("--json", help="also write the report's tables here as JSON (numbers parsed from the cells)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    return parser


def parse(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The options, with torch's threads set from them and transformers' logging quiet (the report is the output)."""
    args = parser.parse_args()
    if args.runs is None:
        args.runs = QUICK_RUNS if args.quick else RUNS
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return args


def python() -> str:
    """The interpreter a script's fresh processes run: this one, or the one `FIVEFOLD_BENCHMARK_PYTHON` names
    (tests/test_benchmarks.py names a warm one, whose children skip the imports; their memory figures are then
    not a fresh process's, and only the --quick tables are checked)."""
    return os.environ.get("FIVEFOLD_BENCHMARK_PYTHON", sys.executable)


def size(model_type: str, hub_id: str, quick: bool) -> tuple[dict, str]:
    """The stock config fields to time and the report's name for them: the public checkpoint's, or the table's
    tiny config with --quick."""
    arch = architecture_for_model_type(model_type)
    return (arch.tiny, f"{model_type} tiny") if quick else (arch.public[hub_id], hub_id)


@dataclass(frozen=True)
class Checkpoints:
    """A random stock checkpoint in the public layout and its fivefold conversion."""

    stock_class: type[transformers.PreTrainedModel]
    stock_dir: Path
    fivefold_dir: Path

    def load_stock(self, **kwargs) -> transformers.PreTrainedModel:
        return self.stock_class.from_pretrained(self.stock_dir, **kwargs).eval()

    def load_fivefold(self, **kwargs) -> transformers.PreTrainedModel:
        arch = architecture_for_model_type(self.stock_class.config_class.model_type)
        return arch.class_named(self.stock_class.__name__).from_pretrained(self.fivefold_dir, **kwargs).eval()


@contextmanager
def checkpoints(
    stock_class: type[transformers.PreTrainedModel],
    fields: dict,
    init: Callable[[transformers.PreTrainedModel], None] | None = None,
) -> Iterator[Checkpoints]:
    """A stock `stock_class` with the config `fields`, random-initialised with seed 0 (then changed by `init`, if
    given, without autograd), saved with `save_pretrained` and converted; the folders last as long as the block."""
    with tempfile.TemporaryDirectory() as folder:
        found = Checkpoints(stock_class, Path(folder, "stock"), Path(folder, "fivefold"))
        torch.manual_seed(0)
        model = stock_class(stock_class.config_class(**fields))
        if init is not None:
            with torch.no_grad():
                init(model)
        model.save_pretrained(found.stock_dir)
        del model  # only the models loaded from the folders should hold memory while they are measured
        fivefold.convert(found.stock_dir, found.fivefold_dir, progress=False)
        yield found


@dataclass(frozen=True)
class Timing:
    """The seconds of each run of one contender, in the order run."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> tuple[float, float]:
        """The fastest and the slowest run."""
        return min(self.seconds), max(self.seconds)


def alternate(contenders: dict[Key, Callable[[], object]], runs: int) -> dict[Key, Timing]:
    """Times every contender once per run, in turn, so that a change in the machine's load hits all of them alike."""
    seconds = {key: [] for key in contenders}
    for _ in range(runs):
        for key, run in contenders.items():
            start = time.perf_counter()
            run()
            seconds[key].append(time.perf_counter() - start)
    return {key: Timing(tuple(s)) for key, s in seconds.items()}


# The instructions a figure may depend on that `get_cpu_capability()` does not name (it says AVX512 on a CPU with
# AMX too): bf16 and int8 dot products, and AMX's tiles.
CPU_FEATURES = ("avx512_bf16", "avx512_vnni", "avx_vnni", "avx512_fp16", "amx_bf16", "amx_int8")


def machine_line(details: str) -> str:
    """The report's first line: the machine, its instruction set and the versions measured, then the script's
    `details`."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        cpu = re.search(r"model name\s*:\s*(.*)", info)[1]
        flags = set(re.search(r"flags\s*:\s*(.*)", info)[1].split())
    except (OSError, TypeError):  # not Linux, or no model name in it
        cpu, flags = platform.processor() or "unknown CPU", set()
    features = ", ".join(f for f in CPU_FEATURES if f in flags) or "none of " + ", ".join(CPU_FEATURES)
    return (
        f"machine: {cpu} ({platform.machine()}), {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()};"
        f" capability {torch.backends.cpu.get_cpu_capability()} ({features});"
        f" torch {torch.__version__}, transformers {transformers.__version__}, fivefold {fivefold.__version__};"
        f" {details}"
    )


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Markdown lines of a table whose cells are already formatted."""
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(cells)} |" for cells in rows)]


def cell_value(cell: str) -> object:
    """A table cell as JSON holds it: a number where the cell is one ("1,234", "2.10x", "1.5e-06", "87%"),
    else the text."""
    text = cell.strip().replace(",", "")
    for suffix, scale in (("x", 1.0), ("%", 0.01), ("", 1.0)):
        if suffix and not text.endswith(suffix):
            continue
        try:
            return float(text.removesuffix(suffix) if suffix else text) * scale
        except ValueError:
            continue
    return cell


def timing_results(architecture: str, rows: list[list[str]]) -> list[dict]:
    """Chart results (benchmarks/charts.py) from timing rows [what, shape, stock experts, stock ms, fivefold ms, ...]:
    one bar per row, a time (lower is better)."""
    return [
        {
            "architecture": architecture,
            "benchmark": f"{architecture} (reduced), {what} {shape}, stock {impl}",
            "unit": "ms",
            "higher_is_better": False,
            "stock": cell_value(stock),
            "fivefold": cell_value(ours),
        }
        for what, shape, impl, stock, ours, *_ in rows
    ]


def table_cells(line: str) -> list[str]:
    """The cells of a markdown table row, empty ones included ("| a |  |" is ["a", ""])."""
    return [c.strip() for c in line.strip()[1:-1].split("|")]


def report_json(lines: list[str], results: list[dict] | None = None) -> dict:
    """The report as data: its machine line, the `results` a script gives in the format benchmarks/charts.py
    reads (stock, fivefold and, where measured, onnxruntime per benchmark), every markdown table as rows keyed by
    the header, and the other lines (notes), in order."""
    tables, notes, i = [], [], 1
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = table_cells(lines[i])
            i += 2
            rows = []
            while i < len(lines) and lines[i].startswith("| "):
                cells = table_cells(lines[i])
                rows.append({h: cell_value(c) for h, c in zip(header, cells, strict=True)})
                i += 1
            tables.append({"header": header, "rows": rows})
            continue
        if lines[i].strip():
            notes.append(lines[i])
        i += 1
    machine = lines[0] if lines else ""
    return {"source": "benchmarks/", "machine": machine, "results": results or [], "tables": tables, "notes": notes}


def write_report(lines: list[str], out: str | None, json_out: str | None = None, results: list | None = None) -> None:
    """Prints the report and, with --out, writes it there too; with --json, the report as data (report_json)."""
    report = "\n".join(lines)
    print(report)
    if out:
        Path(out).write_text(report + "\n")
    if json_out:
        Path(json_out).write_text(json.dumps(report_json(lines, results), indent=1) + "\n")
