"""Conversion between the public checkpoint layouts and fivefold's."""

from .convert import convert, export
from .errors import CheckpointWarning, ConversionError
from .loading import open_stock_checkpoint
from .remote_code import write_remote_code

__all__ = ["CheckpointWarning", "ConversionError", "convert", "export", "open_stock_checkpoint", "write_remote_code"]
