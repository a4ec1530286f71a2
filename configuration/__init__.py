"""Configurations: the stock config of each architecture under a fivefold model type."""

from .bert import FivefoldBertConfig
from .modernbert import FivefoldModernBertConfig
from .roberta import FivefoldRobertaConfig
from .vit import FivefoldViTConfig

__all__ = ["FivefoldBertConfig", "FivefoldModernBertConfig", "FivefoldRobertaConfig", "FivefoldViTConfig"]
