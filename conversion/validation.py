"""Checking tensors against the target model: every tensor has a place in the architecture and the right shape
and kind of dtype, none of the target's is missing, and names that should hold one tensor do.

The target model is known from an instance built on the meta device (no memory), one per class and config
content: a conversion asks about the target and every other class of its architecture several times over."""

import json
import warnings
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights

from .errors import CheckpointWarning, ConversionError
from .keymap import Plan
from .limits import check_tensor_count
from .reader import CheckpointReader

_MAX_META_MODELS = 64  # a few architectures' worth of classes, each with a handful of configs


@dataclass(frozen=True)
class MetaModel:
    tensors: dict[str, tuple[tuple[int, ...], torch.dtype]]  # key -> (shape, dtype)
    tied: dict[str, str]  # {copy: source}: tensors that loading re-creates from their source


# Keyed on the config's content, not the object: a caller may change a config between two questions.
_meta_models: dict[tuple[type, str], MetaModel] = {}


def meta_model(target: type[PreTrainedModel], config: PretrainedConfig) -> MetaModel:
    """What `target` built for `config` holds; built once per (class, config content), shared by every caller."""
    # repr for values JSON lacks: a config that could not be saved can still be checked. Which class a checkpoint
    # names (`architectures`) builds nothing different: the classes of one checkpoint share their builds.
    fields = {k: v for k, v in config.to_dict().items() if k not in ("architectures", "_name_or_path")}
    key = (target, json.dumps(fields, sort_keys=True, default=repr))
    if key not in _meta_models:
        if len(_meta_models) >= _MAX_META_MODELS:
            del _meta_models[next(iter(_meta_models))]
        _meta_models[key] = _build_on_meta(target, config)
    return _meta_models[key]


def _build_on_meta(target: type[PreTrainedModel], config: PretrainedConfig) -> MetaModel:
    try:
        with torch.device("meta"), no_init_weights():  # as from_pretrained builds it: shapes only, no init drawn
            model = target(config)
    except (RuntimeError, ValueError, TypeError, OverflowError, MemoryError) as e:
        # Sizes each within bounds whose product still overflows a tensor's byte count, a part the config names
        # that does not exist: the config's fault, said in one line.
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConversionError(f"cannot build {target.__name__} from this config: {reason}") from None
    tensors = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    tied = dict(model.all_tied_weights_keys) if getattr(config, "tie_word_embeddings", False) else {}
    return MetaModel(tensors, tied)


def expected_tensors(target: type[PreTrainedModel], config: PretrainedConfig) -> tuple[dict, dict[str, str]]:
    """Our model's tensors and shapes, and its tied tensors ({copy: source}) that loading re-creates from their
    source."""
    model = meta_model(target, config)
    return {k: shape for k, (shape, _) in model.tensors.items()}, dict(model.tied)


def expected_dtypes(target: type[PreTrainedModel], config: PretrainedConfig) -> dict[str, torch.dtype]:
    return {k: dtype for k, (_, dtype) in meta_model(target, config).tensors.items()}


def our_prefix(arch, target) -> str:
    return "" if target is arch.base_model else target.base_model_prefix


def stock_name_of(arch, target, config, our_key: str) -> str:
    try:
        plan = arch.keys(config).plan([our_key], arch.stock_prefix_of(target), our_prefix(arch, target), inverse=True)
        return plan.steps[0].targets[plan.steps[0].sources.index(our_key)]
    except (ConversionError, IndexError, ValueError):
        return our_key


def stock_names_of(arch, target, config, our_keys: list[str]) -> list[str]:
    """The stock names of our tensors, in order, without repeats: fused stock tensors (GPT-2's c_attn holding
    q, k and v) are found only from their whole group, so the keys are planned together first."""
    try:
        plan = arch.keys(config).plan(our_keys, arch.stock_prefix_of(target), our_prefix(arch, target), inverse=True)
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
    check_tensor_count(config, len(shapes))
    expected, tied = expected_tensors(target, config)
    # The other heads' tensors only where a key is not the target's own: each head is a model built on the meta
    # device (Qwen3-30B-A3B's 6,144 experts: seconds a head). So a config that builds the target converts whatever
    # another head would make of it.
    known = None
    needed = expected_dtypes(target, config) if dtypes else {}
    for key, dtype in (dtypes or {}).items():
        if key in needed and dtype.is_floating_point != needed[key].is_floating_point:
            kind = "a floating-point" if needed[key].is_floating_point else f"a {needed[key]}"
            raise ConversionError(f"tensor {origin[key]!r} has dtype {dtype}; {target.__name__} needs {kind} tensor")
    for key, shape in shapes.items():
        if key not in expected and known is None:
            known = known_tensors(arch, target, config)
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
    fresh = optional_tensors(arch, target, config) if strict and missing else set()
    required = [k for k in missing if k not in fresh]
    if strict and required:
        names = stock_names_of(arch, target, config, required) if stock_names else required
        listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise ConversionError(f"{len(names)} tensor(s) missing from the checkpoint for {target.__name__}: {listed}")
    if strict and missing:
        names = stock_names_of(arch, target, config, missing) if stock_names else missing
        listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        warnings.warn(
            f"{len(names)} tensor(s) of {target.__name__} are not in the checkpoint and not written: loading "
            f"initialises them fresh, as stock transformers does: {listed}",
            CheckpointWarning,
            stacklevel=3,
        )
    return tied


def optional_tensors(arch, target, config) -> set[str]:
    """The tensors a stock class initialises fresh (with a warning) when a checkpoint lacks them, and a conversion
    therefore may lack: the heads' (everything outside the backbone) and the poolers'. A checkpoint without
    backbone tensors is refused."""
    expected, _ = expected_tensors(target, config)
    if target is arch.base_model:
        backbone = set(expected)
    else:
        prefix = f"{our_prefix(arch, target)}." if our_prefix(arch, target) else ""
        backbone = {prefix + k for k in expected_tensors(arch.base_model, config)[0]}
    return {k for k in expected if k not in backbone or ".pooler." in f".{k}"}


def check_plan(
    arch, target, config, plan: Plan, source_shapes: dict, strict: bool, reader: CheckpointReader | None = None
) -> tuple[dict, dict]:
    """Checks what the plan produces against the target model (dtypes too, given the reader). Returns the
    produced shapes and the target's tied tensors ({copy: source})."""
    produced = plan.target_shapes(source_shapes)
    origin = {t: step.sources[0] for step in plan.steps for t in step.targets}
    dtypes = plan.target_dtypes(reader.dtype) if reader is not None else None
    return produced, check_tensors(arch, target, config, produced, origin, strict, dtypes, source_shapes)


def check_aliases(plan: Plan, reader: CheckpointReader) -> None:
    for alias, kept in plan.aliases:
        if not torch.equal(reader.get(alias), reader.get(kept)):
            raise ConversionError(f"tensors {alias!r} and {kept!r} should be the same tensor but differ")


def drop_tied_copies(plan: Plan, reader, config, tied: dict[str, str]) -> None:
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
