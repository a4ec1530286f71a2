"""verify: the stock model and ours on the same inputs, max abs difference per output."""

import os

import torch
import transformers
from transformers.core_model_loading import revert_weight_conversion

from .hub import HubRef
from .sanitize import without_code_selectors
from .source import architecture_of, model_class_of, read_config, resolve_source
from .validation import our_prefix


def _tensors(output, prefix: str = "") -> dict[str, torch.Tensor]:
    found = {}
    for key, value in output.items():
        if torch.is_tensor(value) and value.is_floating_point():
            found[prefix + key] = value
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if torch.is_tensor(item) and item.is_floating_point():
                    found[f"{prefix}{key}[{i}]"] = item
    return found


def max_abs_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None) -> float:
    """Padded positions excluded: outputs shaped [B, T, ...] are compared where mask is 1."""
    diff = (a.float() - b.float()).abs()
    if mask is not None and diff.dim() >= 2 and tuple(diff.shape[:2]) == tuple(mask.shape):
        diff = diff[mask.bool()]
    return float(diff.max()) if diff.numel() else 0.0


def compare(stock_model, our_model, inputs: dict) -> dict[str, float]:
    with torch.no_grad():
        expected = _tensors(stock_model(**inputs, output_hidden_states=True))
        got = _tensors(our_model(**inputs, output_hidden_states=True))
    mask = inputs.get("attention_mask")
    mask = mask.reshape(-1, mask.shape[-1]) if mask is not None and mask.dim() >= 2 else None
    diffs = {}
    for key, value in expected.items():
        if key not in got:
            raise AssertionError(f"output {key} missing from the fivefold model")
        if got[key].shape != value.shape:
            raise AssertionError(f"output {key}: shape {tuple(got[key].shape)} != stock {tuple(value.shape)}")
        diffs[key] = max_abs_diff(value, got[key], mask)
    return diffs


def verify(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    seed: int = 0,
    *,
    revision: str | None = None,
    subfolder: str | None = None,
    dst_revision: str | None = None,
    dst_subfolder: str | None = None,
    token: str | bool | None = None,
) -> dict[str, float]:
    """Loads SRC with stock transformers and DST with fivefold (each a folder or a Hub id, at its own revision and
    subfolder), runs the architecture's sample batch (text: ragged and padded) through both and returns the max abs
    difference of every floating output (logits, hidden states, pooler output...)."""
    src_folder = resolve_source(src, HubRef(revision, subfolder, token))
    dst_folder = resolve_source(dst, HubRef(dst_revision, dst_subfolder, token))
    stock_cfg, our_cfg = read_config(src_folder), read_config(dst_folder)
    arch = architecture_of(stock_cfg, src_folder, want_stock=True)
    architecture_of(our_cfg, dst_folder, want_stock=False)
    ours_cls = model_class_of(arch, our_cfg, dst_folder)
    stock_cls = getattr(transformers, model_class_of(arch, stock_cfg, src_folder).__name__.removeprefix("Fivefold"))
    # SRC's own config.json may name kernels or quantisers to fetch: the stock model gets every field but those.
    stock_config = stock_cls.config_class.from_dict(without_code_selectors(stock_cfg))
    stock = stock_cls.from_pretrained(src_folder, config=stock_config, dtype=torch.float32).eval()
    ours, info = ours_cls.from_pretrained(dst_folder, dtype=torch.float32, output_loading_info=True)
    share_fresh_tensors(arch, stock, ours.eval(), set(info["missing_keys"]))
    return compare(stock, ours, arch.sample_inputs(stock.config, stock_cls.__name__, seed))


def share_fresh_tensors(arch, stock, ours, missing: set[str]) -> None:
    """Tensors the checkpoint lacks (a pooler, a head) are initialised fresh on both sides, from different random
    draws: ours get stock's values, so that the comparison is of what the checkpoint holds."""
    if missing:
        ours.load_state_dict(stock_values_of(arch, stock, type(ours), ours.config, missing), strict=False)


def stock_values_of(arch, stock, target: type, config, keys: set[str]) -> dict[str, torch.Tensor]:
    """The stock model's tensors under our names (`keys` of a `target` model), through the key map."""
    state = revert_weight_conversion(stock, stock.state_dict())  # the names a stock checkpoint holds
    plan = arch.keys(config).plan(list(state), arch.stock_prefix_of(target), our_prefix(arch, target))
    found = {}
    for step in plan.steps:
        if keys & set(step.targets):
            found.update({k: v for k, v in plan.run(step, state.__getitem__).items() if k in keys})
    return found
