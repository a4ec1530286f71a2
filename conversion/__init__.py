"""Conversion between the public checkpoint layouts and fivefold's."""

from .convert import convert, export
from .errors import CheckpointWarning, ConversionError
from .loading import open_stock_checkpoint
from .remote_code import write_remote_code
from .saving import updated_folder

__all__ = ["CheckpointWarning", "ConversionError", "convert", "export", "open_stock_checkpoint", "updated_folder",
           "write_remote_code"]  # fmt: skip
