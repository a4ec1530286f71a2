"""Configurations: the stock config of each architecture under a fivefold model type."""

from .bert import FivefoldBertConfig
from .gpt2 import FivefoldGPT2Config
from .mixtral import FivefoldMixtralConfig
from .modernbert import FivefoldModernBertConfig
from .roberta import FivefoldRobertaConfig
from .t5 import FivefoldT5Config
from .vit import FivefoldViTConfig

__all__ = [
    "FivefoldBertConfig",
    "FivefoldGPT2Config",
    "FivefoldMixtralConfig",
    "FivefoldModernBertConfig",
    "FivefoldRobertaConfig",
    "FivefoldT5Config",
    "FivefoldViTConfig",
]
