"""Conversion between the public checkpoint layouts and fivefold's."""

from .convert import convert, export
from .errors import CheckpointWarning, ConversionError
from .hub import push_folder
from .loading import open_stock_checkpoint
from .remote_code import remote_code_bytes, write_remote_code
from .saving import updated_folder
from .verify import verify

__all__ = [
    "CheckpointWarning",
    "ConversionError",
    "convert",
    "export",
    "open_stock_checkpoint",
    "push_folder",
    "remote_code_bytes",
    "updated_folder",
    "verify",
    "write_remote_code",
]
