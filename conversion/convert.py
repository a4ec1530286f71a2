"""convert / export: stock checkpoint <-> fivefold checkpoint, every tensor accounted for, written atomically."""

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import PretrainedConfig, PreTrainedModel

from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.architecture import stock_class_name

from .checkpoint import (
    CheckpointReader,
    atomic_folder,
    check_destination,
    checked_getter,
    copy_side_files,
    parse_size,
    read_json,
    write_safetensors,
)
from .errors import ConversionError
from .keymap import Plan
from .remote_code import write_remote_code

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_NOT_CONFIG = ("auto_map", "transformers_version", "architectures", "model_type", "_name_or_path", "custom_pipelines")


def resolve_source(src: str | os.PathLike) -> Path:
    """A local folder, or a Hub repo id downloaded (config, weights, tokenizer files) when online."""
    path = Path(src)
    if path.is_dir():
        return path
    if path.exists():
        raise ConversionError(f"{src} is a file; pass the checkpoint folder")
    try:
        from huggingface_hub import snapshot_download

        side = ["*.json", "*.txt", "*.model"]
        folder = Path(snapshot_download(str(src), allow_patterns=[*side, "*.safetensors"]))
        if not any(folder.glob("*.safetensors")):  # legacy repos hold only .bin weights
            folder = Path(snapshot_download(str(src), allow_patterns=[*side, "*.bin"]))
        return folder
    except Exception as e:
        raise ConversionError(f"{src} is neither a local folder nor a reachable Hub repo: {e}") from None


def read_config(folder: Path) -> dict:
    config = read_json(folder / "config.json")
    if "model_type" not in config:
        raise ConversionError(f"{folder / 'config.json'} has no model_type")
    return config


def architecture_of(config: dict, folder: Path, want_stock: bool):
    try:
        arch = architecture_for_model_type(config["model_type"])
    except KeyError as e:
        raise ConversionError(f"{folder / 'config.json'}: {e.args[0]}") from None
    is_stock = config["model_type"] == arch.stock_model_type
    if want_stock and not is_stock:
        raise ConversionError(f"{folder} is already a fivefold checkpoint ({config['model_type']})")
    if not want_stock and is_stock:
        raise ConversionError(f"{folder} is a stock {config['model_type']} checkpoint, not a fivefold one")
    return arch


def model_class_of(arch, config: dict, folder: Path) -> type[PreTrainedModel]:
    names = config.get("architectures") or [arch.base_model.__name__]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConversionError(f"{folder / 'config.json'}: architectures must be a list of class names, got {names!r}")
    try:
        return arch.class_named(names[0])
    except KeyError as e:
        raise ConversionError(f"{folder / 'config.json'}: architectures: {e.args[0]}") from None


def config_from_dict(arch, fields: dict, folder: Path) -> PretrainedConfig:
    """The config class's own validation, reported as a ConversionError naming config.json and the field."""
    try:
        return arch.config_class.from_dict(fields)
    except Exception as e:
        # huggingface_hub's strict-dataclass errors wrap the message that names the field: show that one.
        cause = e.__cause__ if isinstance(e, StrictDataclassError) and e.__cause__ is not None else e
        raise ConversionError(
            f"{folder / 'config.json'} is not a valid {arch.stock_model_type} config: {cause}"
        ) from None


def build_config(arch, stock: dict, target: type[PreTrainedModel], folder: Path) -> PretrainedConfig:
    fields = {k: v for k, v in stock.items() if k not in _NOT_CONFIG}
    return config_from_dict(arch, {**fields, "architectures": [target.__name__]}, folder)


def expected_tensors(target: type[PreTrainedModel], config: PretrainedConfig) -> tuple[dict, dict[str, str]]:
    """Our model's tensors and shapes, built on the meta device (no memory), and its tied tensors
    ({copy: source}) that loading re-creates from their source."""
    with torch.device("meta"):
        model = target(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = dict(model.all_tied_weights_keys) if getattr(config, "tie_word_embeddings", False) else {}
    return shapes, tied


def expected_dtypes(target: type[PreTrainedModel], config: PretrainedConfig) -> dict[str, torch.dtype]:
    with torch.device("meta"):
        return {k: v.dtype for k, v in target(config).state_dict().items()}


def our_prefix(arch, target) -> str:
    return "" if target is arch.base_model else target.base_model_prefix


def stock_name_of(arch, target, config, our_key: str) -> str:
    try:
        plan = arch.keys(config).plan([our_key], arch.stock_prefix, our_prefix(arch, target), inverse=True)
        return plan.steps[0].targets[plan.steps[0].sources.index(our_key)]
    except (ConversionError, IndexError, ValueError):
        return our_key


def stock_names_of(arch, target, config, our_keys: list[str]) -> list[str]:
    """The stock names of our tensors, in order, without repeats: fused stock tensors (GPT-2's c_attn holding
    q, k and v) are found only from their whole group, so the keys are planned together first."""
    try:
        plan = arch.keys(config).plan(our_keys, arch.stock_prefix, our_prefix(arch, target), inverse=True)
        named = {
            source: step.targets[min(i, len(step.targets) - 1)]
            for step in plan.steps
            for i, source in enumerate(step.sources)
        }
    except (ConversionError, IndexError, ValueError):
        named = {}
    return list(dict.fromkeys(named.get(k) or stock_name_of(arch, target, config, k) for k in our_keys))


def known_tensors(arch, target, config) -> dict[str, set[tuple]]:
    """Every tensor the architecture's other models have, named as in a `target` checkpoint, with its shapes.
    Tensors a checkpoint holds for another head (bert-base-uncased's pooler and NSP head in a masked-LM
    checkpoint) are kept for the round trip; anything outside this set is refused."""
    base_prefix = our_prefix(arch, target)
    known: dict[str, set[tuple]] = {}
    for cls in arch.models.values():
        if cls is target:  # the caller checks the target's own tensors exactly
            continue
        shapes, _ = expected_tensors(cls, config)
        for key, shape in shapes.items():
            if cls is arch.base_model and base_prefix:
                key = f"{base_prefix}.{key}"
            elif cls is not arch.base_model and not base_prefix:
                key = key.removeprefix(f"{cls.base_model_prefix}.")
            known.setdefault(key, set()).add(shape)
    return known


def check_tensors(
    arch,
    target,
    config,
    shapes: dict[str, tuple],
    origin: dict[str, str] | None,
    strict: bool,
    dtypes: dict[str, torch.dtype] | None = None,
    source_shapes: dict[str, tuple] | None = None,
) -> dict[str, str]:
    """Checks tensors named as ours against the target model: every one is a tensor of the architecture with
    the right shape (and, given `dtypes`, a floating-point tensor exactly where the model has one), and (strict)
    none of the target's is missing. `origin` maps each to its name in the stock checkpoint being read (None: the
    checkpoint read is ours; `source_shapes` by those names, when a transform changes shapes). Returns the
    target's tied tensors ({copy: source})."""
    stock_names = origin is not None
    origin = origin if stock_names else {k: k for k in shapes}
    expected, tied = expected_tensors(target, config)
    known = known_tensors(arch, target, config)
    needed = expected_dtypes(target, config) if dtypes else {}
    for key, dtype in (dtypes or {}).items():
        if key in needed and dtype.is_floating_point != needed[key].is_floating_point:
            kind = "a floating-point" if needed[key].is_floating_point else f"a {needed[key]}"
            raise ConversionError(f"tensor {origin[key]!r} has dtype {dtype}; {target.__name__} needs {kind} tensor")
    for key, shape in shapes.items():
        wanted = {expected[key]} if key in expected else known.get(key)
        if not wanted:
            raise ConversionError(
                f"tensor {origin[key]!r} has no place in a {arch.model_type} model (it would be {key!r})"
            )
        if tuple(shape) not in wanted:
            need = " or ".join(str(list(w)) for w in sorted(wanted))
            have = tuple((source_shapes or {}).get(origin[key], shape))
            becomes = f" (which it becomes as {list(shape)})" if have != tuple(shape) else ""
            raise ConversionError(
                f"tensor {origin[key]!r} has shape {list(have)}; {target.__name__} needs {need} for {key!r}"
                f"{becomes} (config: {config.model_type})"
            )
    missing = sorted(set(expected) - set(shapes) - set(tied))
    if strict and missing:
        names = stock_names_of(arch, target, config, missing) if stock_names else missing
        listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise ConversionError(f"{len(names)} tensor(s) missing from the checkpoint for {target.__name__}: {listed}")
    return tied


def check_plan(
    arch, target, config, plan: Plan, source_shapes: dict, strict: bool, reader: CheckpointReader | None = None
) -> tuple[dict, dict]:
    """Checks what the plan produces against the target model (dtypes too, given the reader). Returns the
    produced shapes and the target's tied tensors ({copy: source})."""
    produced = plan.target_shapes(source_shapes)
    origin = {t: step.sources[0] for step in plan.steps for t in step.targets}
    dtypes = {t: reader.dtype(source) for t, source in origin.items()} if reader is not None else None
    return produced, check_tensors(arch, target, config, produced, origin, strict, dtypes, source_shapes)


def _check_aliases(plan: Plan, reader: CheckpointReader) -> None:
    for alias, kept in plan.aliases:
        if not torch.equal(reader.get(alias), reader.get(kept)):
            raise ConversionError(f"tensors {alias!r} and {kept!r} should be the same tensor but differ")


def _drop_tied_copies(plan: Plan, reader, config, tied: dict[str, str]) -> None:
    """A stored copy of a tied tensor is dropped when equal to its source; when it differs the config is untied
    and both are kept, as stock transformers does on load."""
    origin = {t: step.sources[0] for step in plan.steps for t in step.targets}
    for copy_key, source_key in tied.items():
        if copy_key not in origin or source_key not in origin:
            continue
        if torch.equal(reader.get(origin[copy_key]), reader.get(origin[source_key])):
            plan.steps = [s for s in plan.steps if copy_key not in s.targets]
        else:
            config.tie_word_embeddings = False


def _materializer(plan: Plan, reader: CheckpointReader, dtype: torch.dtype | None):
    step_of = {t: step for step in plan.steps for t in step.targets}
    get = checked_getter(reader)

    def materialize(keys: list[str]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for key in keys:
            if key not in out:
                out.update({k: v for k, v in plan.run(step_of[key], get).items() if k in keys})
        if dtype is not None:
            out = {k: v.to(dtype) if v.is_floating_point() else v for k, v in out.items()}
        return out

    return materialize


def _sizes(produced: dict, plan: Plan, reader, dtype) -> list[tuple[str, int]]:
    src_dtype = {t: reader.dtype(step.sources[0]) for step in plan.steps for t in step.targets}
    sizes = []
    for key, shape in produced.items():
        dt = dtype if dtype is not None and src_dtype[key].is_floating_point else src_dtype[key]
        sizes.append((key, int(torch.Size(shape).numel()) * torch.empty((), dtype=dt).element_size()))
    return sizes


def _write_weights_and_side_files(tmp: Path, src: Path, plan, reader, produced, dtype, max_shard_size, progress):
    sizes = _sizes(produced, plan, reader, dtype)
    write_safetensors(tmp, sizes, _materializer(plan, reader, dtype), parse_size(max_shard_size), progress)
    if (src / "generation_config.json").is_file():
        shutil.copy2(src / "generation_config.json", tmp / "generation_config.json")
    copy_side_files(src, tmp)


def model_card(base_model: str, target: str, model_type: str) -> str:
    return f"""---
base_model: {base_model}
library_name: transformers
tags:
- fivefold
---

# {Path(base_model).name} for fivefold

`{base_model}` converted with `fivefold convert` to the `{model_type}` layout ({target}).
Tensors were renamed, not changed; `fivefold export` writes the stock layout back.

```python
import fivefold  # registers fivefold's model types
from transformers import AutoModel

model = AutoModel.from_pretrained("path/to/this/folder")
```

Without fivefold installed, pass `trust_remote_code=True` to the model's and the tokenizer's `from_pretrained`:
the modeling code ships in this folder.
"""


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    dtype: str | None = None,
    max_shard_size: int | str = "5GB",
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Converts a public checkpoint (folder or Hub id) into fivefold's layout at `dst`; returns `dst`.

    Raises ConversionError, leaving `dst` untouched, if any tensor is unknown, missing or of the wrong shape.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ConversionError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    dst = check_destination(dst, force)
    folder = resolve_source(src)
    stock = read_config(folder)
    arch = architecture_of(stock, folder, want_stock=True)
    target = model_class_of(arch, stock, folder)
    config = build_config(arch, stock, target, folder)
    reader = CheckpointReader(folder)
    shapes = {k: reader.shape(k) for k in reader.keys()}
    plan = arch.keys(config).plan(reader.keys(), arch.stock_prefix, our_prefix(arch, target))
    _, tied = check_plan(arch, target, config, plan, shapes, strict=True, reader=reader)
    _check_aliases(plan, reader)
    _drop_tied_copies(plan, reader, config, tied)
    produced = plan.target_shapes(shapes)
    if dtype is not None:
        config.dtype = DTYPES[dtype]

    with atomic_folder(dst, force) as tmp:
        _write_weights_and_side_files(tmp, folder, plan, reader, produced, DTYPES.get(dtype), max_shard_size, progress)
        config.auto_map = write_remote_code(tmp, arch.config_class)
        config.save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(str(src), target.__name__, arch.model_type), encoding="utf-8")
    return dst


def stock_config_dict(arch, ours: dict, stock_class: str) -> dict:
    fields = {k: v for k, v in ours.items() if k not in _NOT_CONFIG}
    return {**fields, "architectures": [stock_class], "model_type": arch.stock_model_type}


def export(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Writes a fivefold checkpoint back in the stock layout (the inverse key map: a lossless round trip)."""
    dst = check_destination(dst, force)
    folder = resolve_source(src)
    ours = read_config(folder)
    arch = architecture_of(ours, folder, want_stock=False)
    target = model_class_of(arch, ours, folder)
    config = config_from_dict(arch, ours, folder)
    reader = CheckpointReader(folder)
    shapes = {k: reader.shape(k) for k in reader.keys()}
    dtypes = {k: reader.dtype(k) for k in reader.keys()}
    check_tensors(arch, target, config, shapes, None, strict=True, dtypes=dtypes)
    stock_prefix = "" if target is arch.base_model else arch.stock_prefix
    plan = arch.keys(config).plan(reader.keys(), stock_prefix, our_prefix(arch, target), inverse=True)
    produced = plan.target_shapes(shapes)

    with atomic_folder(dst, force) as tmp:
        _write_weights_and_side_files(tmp, folder, plan, reader, produced, None, max_shard_size, progress)
        stock = stock_config_dict(arch, ours, stock_class_name(target))
        (tmp / "config.json").write_text(json.dumps(stock, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return dst


def _stock_config(name_or_path: str | os.PathLike) -> dict | None:
    """The config of a local folder or Hub repo, or None where there is none to read (transformers will say)."""
    path = Path(name_or_path)
    if path.is_dir():
        return read_config(path) if (path / "config.json").is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return read_json(Path(hf_hub_download(str(name_or_path), "config.json")))
    except Exception:
        return None


def open_stock_checkpoint(cls: type[PreTrainedModel], name_or_path, user_config: PretrainedConfig | None = None):
    """For `FivefoldXxx.from_pretrained(stock_checkpoint)`: a context yielding (config or config folder,
    state dict under our names), or None when `name_or_path` is not a stock checkpoint."""
    stock = _stock_config(name_or_path)
    if stock is None or not stock.get("model_type"):
        return None
    try:
        arch = architecture_for_model_type(stock["model_type"])
    except KeyError:
        return None
    if stock["model_type"] != arch.stock_model_type:
        return None  # already fivefold's layout
    if arch.config_class.__name__ != cls.config_class.__name__:
        raise ConversionError(
            f"{name_or_path} is a {stock['model_type']} checkpoint; {cls.__name__} loads {cls.config_class.model_type}"
        )
    if not isinstance(user_config, PretrainedConfig):
        user_config = None  # a path or None: the config comes from the stock checkpoint
    return _stock_state(arch, cls, resolve_source(name_or_path), stock, user_config)


@contextmanager
def _stock_state(arch, cls, folder: Path, stock: dict, user_config) -> Iterator[tuple]:
    config = user_config if user_config is not None else build_config(arch, stock, cls, folder)
    reader = CheckpointReader(folder)
    shapes = {k: reader.shape(k) for k in reader.keys()}
    plan = arch.keys(config).plan(reader.keys(), arch.stock_prefix, our_prefix(arch, cls))
    check_plan(arch, cls, config, plan, shapes, strict=False, reader=reader)
    _check_aliases(plan, reader)
    state, get = {}, checked_getter(reader)
    for step in plan.steps:
        state.update(plan.run(step, get))
    if user_config is not None:
        yield user_config, state
        return
    with tempfile.TemporaryDirectory(prefix="fivefold-config-") as tmp:
        config.save_pretrained(tmp)
        yield tmp, state
