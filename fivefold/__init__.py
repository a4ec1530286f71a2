"""fivefold: the five Transformer families from one block, as a plugin for Hugging Face transformers.

Importing fivefold registers every fivefold config and model with transformers' Auto classes.
"""

import transformers

from fivefold.architectures import ARCHITECTURES
from fivefold.configuration import (
    FivefoldBertConfig,
    FivefoldGPT2Config,
    FivefoldMixtralConfig,
    FivefoldModernBertConfig,
    FivefoldRobertaConfig,
    FivefoldT5Config,
    FivefoldViTConfig,
)
from fivefold.conversion import ConversionError, convert, export
from fivefold.conversion.errors import CheckpointWarning
from fivefold.modeling import *  # noqa: F403
from fivefold.modeling import __all__ as _modeling_names
from fivefold.span_corruption import DataCollatorForSpanCorruption

__version__ = "0.1.0"


def _register() -> None:
    for arch in ARCHITECTURES:
        transformers.AutoConfig.register(arch.model_type, arch.config_class, exist_ok=True)
        for auto_name, model_class in arch.models.items():
            getattr(transformers, auto_name).register(arch.config_class, model_class, exist_ok=True)


_register()

__all__ = [
    "CheckpointWarning",
    "ConversionError",
    "DataCollatorForSpanCorruption",
    "FivefoldBertConfig",
    "FivefoldModernBertConfig",
    "FivefoldGPT2Config",
    "FivefoldMixtralConfig",
    "FivefoldRobertaConfig",
    "FivefoldT5Config",
    "FivefoldViTConfig",
    "__version__",
    "convert",
    "export",
    *_modeling_names,
]
