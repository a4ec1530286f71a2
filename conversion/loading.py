"""`FivefoldXxx.from_pretrained(stock_checkpoint)`: a stock checkpoint converted in memory, nothing written but a
temporary config."""

import os
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from transformers import PretrainedConfig, PreTrainedModel

from fivefold.architectures import architecture_for_model_type
from fivefold.modeling.pinned_folder import loading_from

from .errors import ConversionError
from .hub import HubRef
from .reader import CheckpointReader, checked_getter, renamed_by
from .side_files import generation_config_of
from .source import build_config, read_config_if_any, resolve_source
from .validation import check_aliases, check_plan, our_prefix


def open_stock_checkpoint(
    cls: type[PreTrainedModel],
    name_or_path: str | os.PathLike,
    user_config: PretrainedConfig | None = None,
    *,
    revision: str | None = None,
    subfolder: str | None = None,
    token: str | bool | None = None,
    variant: str | None = None,
    use_safetensors: bool | None = None,
    key_mapping: dict[str, str] | None = None,
) -> AbstractContextManager[tuple] | None:
    """For `FivefoldXxx.from_pretrained(stock_checkpoint)`: a context yielding (config or config folder,
    state dict under our names, the generation config transformers reads beside it or None), or None when
    `name_or_path` is not a stock checkpoint. A Hub repo is read at
    `revision`, inside `subfolder`, with `token`; the weights files as `variant` and `use_safetensors` pick them,
    their tensors renamed by `key_mapping` before conversion: all as transformers would."""
    ref = HubRef(revision=revision, subfolder=subfolder or None, token=token)
    stock = read_config_if_any(name_or_path, ref)
    if stock is None or not stock.get("model_type"):
        return None
    try:
        arch = architecture_for_model_type(stock["model_type"])
    except KeyError:
        return None
    if arch.config_class.__name__ != cls.config_class.__name__:  # a stock or a fivefold folder of another kind
        raise ConversionError(
            f"{name_or_path} is a {stock['model_type']} checkpoint; {cls.__name__} loads {cls.config_class.model_type}"
        )
    if stock["model_type"] != arch.stock_model_type:
        return None  # already fivefold's layout
    if not isinstance(user_config, PretrainedConfig):
        user_config = None  # a path or None: the config comes from the stock checkpoint
    folder = resolve_source(name_or_path, ref)
    reader = CheckpointReader(folder, renamed_by(key_mapping), variant, use_safetensors)
    return _stock_state(arch, cls, folder, reader, stock, user_config, name_or_path)


@contextmanager
def _stock_state(arch, cls, folder: Path, reader: CheckpointReader, stock: dict, user_config, name) -> Iterator[tuple]:
    # The checkpoint's tensors are converted as its own config lays them out; a user's config (fewer layers, say)
    # then decides which of them the model takes, and transformers reports the rest as stock's loading does.
    config = build_config(arch, stock, cls, folder)
    shapes = {k: reader.shape(k) for k in reader.keys()}
    plan = arch.keys(config).plan(reader.keys(), arch.stock_prefix_of(cls), our_prefix(arch, cls))
    check_plan(arch, cls, config, plan, shapes, strict=False, reader=reader)
    check_aliases(plan, reader)
    state, get = {}, checked_getter(reader)
    for step in plan.steps:
        state.update(plan.run(step, get))
    generation = generation_config_of(folder, stock, cls)
    with loading_from(name):  # what transformers' loading report names: the folder or Hub id given
        if user_config is not None:
            yield user_config, state, generation
            return
        with tempfile.TemporaryDirectory(prefix="fivefold-config-") as tmp:
            config.save_pretrained(tmp)
            yield tmp, state, generation
