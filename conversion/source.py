"""Where a conversion starts: the checkpoint folder (local or from the Hub), its config.json, the architecture and
target class it names, and the config built from it."""

import os
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError
from transformers import PretrainedConfig, PreTrainedModel

from fivefold.architectures import architecture_for_model_type

from .errors import ConversionError
from .hub import LATEST, HubRef, download, looks_local
from .reader import read_json
from .sanitize import kept_fields


def resolve_source(src: str | os.PathLike, ref: HubRef = LATEST) -> Path:
    """A local folder, or a Hub repo id downloaded (config, weights, tokenizer and model card files) at
    `ref.revision`. A path that cannot be a repo id and does not exist fails at once, with no network wait."""
    path = Path(src)
    if path.is_dir():
        folder = path / ref.subfolder if ref.subfolder else path
        if not folder.is_dir():
            raise ConversionError(f"{src} has no folder {ref.subfolder}")
        return folder
    if path.exists():
        raise ConversionError(f"{src} is a file; pass the checkpoint folder")
    if isinstance(src, os.PathLike) or looks_local(str(src)):
        raise ConversionError(f"{src}: no such folder (and not a Hub repo id)")
    try:
        return download(str(src), ref)
    except ConversionError:
        raise
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


def config_from_dict(arch, fields: dict, folder: Path | None) -> PretrainedConfig:
    """The config class's own validation, reported as a ConversionError naming config.json and the field."""
    try:
        return arch.config_class.from_dict(fields)
    except Exception as e:
        # huggingface_hub's strict-dataclass errors wrap the message that names the field: show that one.
        cause = e.__cause__ if isinstance(e, StrictDataclassError) and e.__cause__ is not None else e
        raise ConversionError(
            f"{folder / 'config.json'} is not a valid {arch.stock_model_type} config: {cause}"
        ) from None


def check_quantization(arch, stock: dict, folder: Path) -> None:
    """A quantized stock checkpoint converts only where the key map reads its stored layout (`quantized_layouts`):
    its tensors are dequantized then, and its `quantization_config` is not carried over."""
    quantization = stock.get("quantization_config")
    if quantization is None:
        return
    method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
    if method not in arch.quantized_layouts:
        layouts = f" or quantized with {', '.join(arch.quantized_layouts)}" if arch.quantized_layouts else ""
        raise ConversionError(
            f"{folder / 'config.json'}: quantization_config has quant_method {method!r}; fivefold converts "
            f"{arch.stock_model_type} checkpoints in full precision{layouts} (quantize the converted model instead, "
            "with quantization_config= in from_pretrained)"
        )


def build_config(arch, stock: dict, target: type[PreTrainedModel], folder: Path) -> PretrainedConfig:
    check_quantization(arch, stock, folder)
    return config_from_dict(arch, {**kept_fields(arch.config_class, stock), "architectures": [target.__name__]}, folder)


def stock_config_dict(arch, ours: dict, stock_class: str) -> dict:
    fields = kept_fields(arch.config_class, ours)
    return {**fields, "architectures": [stock_class], "model_type": arch.stock_model_type}


def read_config_if_any(name_or_path: str | os.PathLike, ref: HubRef = LATEST) -> dict | None:
    """The config of a local folder or Hub repo, or None where there is none to read (transformers will say)."""
    path = Path(name_or_path)
    if path.is_dir():
        path = path / ref.subfolder if ref.subfolder else path
        # Anything named config.json is read here, so that a FIFO or a device is refused rather than hung on.
        return read_config(path) if os.path.lexists(path / "config.json") else None
    try:
        from huggingface_hub import hf_hub_download

        kwargs = dict(subfolder=ref.subfolder, revision=ref.revision, token=ref.token)
        return read_json(Path(hf_hub_download(str(name_or_path), "config.json", **kwargs)))
    except Exception:
        return None
