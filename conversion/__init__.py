"""Conversion between the public checkpoint layouts and fivefold's."""

from .convert import convert, export
from .errors import CheckpointWarning, ConversionError
from .hub import push_folder
from .loading import open_stock_checkpoint
from .remote_code import write_remote_code
from .verify import verify
from .writer import updated_folder

__all__ = [
    "CheckpointWarning",
    "ConversionError",
    "convert",
    "export",
    "open_stock_checkpoint",
    "push_folder",
    "updated_folder",
    "verify",
    "write_remote_code",
]
