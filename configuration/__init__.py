"""Configurations: the stock config of each architecture under a fivefold model type."""

from .bert import FivefoldBertConfig
from .roberta import FivefoldRobertaConfig
from .t5 import FivefoldT5Config

__all__ = ["FivefoldBertConfig", "FivefoldRobertaConfig", "FivefoldT5Config"]
