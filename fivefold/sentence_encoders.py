"""sentence-transformers' encoder-only classes for fivefold's encoder-decoder configs.

sentence-transformers (6.x) embeds with the encoder alone of an encoder-decoder checkpoint, and picks that encoder's
class by the config's class from a table (`_ENCODER_ONLY_MODELS` in `sentence_transformers.base.modules.transformer`)
whose T5 row names stock's `T5EncoderModel`. fivefold's T5 config subclasses `T5Config`, so it matches that row, and
stock's class would load a converted folder with every weight missing, initialised at random, and embed with them.
fivefold's row, ahead of it, names `FivefoldT5EncoderModel`. sentence-transformers 5.x loads T5 through its own
`T5Config` branch, which has no table to add to: there, load a converted T5 folder with stock's layout
(`fivefold export`)."""

from types import ModuleType

from .after_import import when_imported

_MODULE = "sentence_transformers.base.modules.transformer"
_TABLE = "_ENCODER_ONLY_MODELS"


def add_rows(module: ModuleType) -> None:
    """fivefold's row at the head of the table in sentence-transformers' module (one being imported)."""
    table = getattr(module, _TABLE, None)
    if not isinstance(table, list):
        return
    from fivefold.configuration.t5 import FivefoldT5Config

    row = (FivefoldT5Config, "fivefold", "FivefoldT5EncoderModel")
    if row not in table:
        table.insert(0, row)


def register() -> None:
    """Adds fivefold's rows now (sentence-transformers imported) or when sentence-transformers is imported."""
    when_imported(_MODULE, add_rows)
