"""fivefold: the five Transformer families from one block, as a plugin for Hugging Face transformers.

Importing fivefold registers every fivefold config and model with transformers' Auto classes.
"""

import transformers

from fivefold.architectures import ARCHITECTURES
from fivefold.configuration import FivefoldBertConfig, FivefoldRobertaConfig
from fivefold.conversion import ConversionError, convert, export
from fivefold.conversion.errors import CheckpointWarning
from fivefold.modeling import *  # noqa: F403
from fivefold.modeling import __all__ as _modeling_names

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
    "FivefoldBertConfig",
    "FivefoldRobertaConfig",
    "__version__",
    "convert",
    "export",
    *_modeling_names,
]
