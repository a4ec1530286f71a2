"""The one exception a user sees when a checkpoint or a conversion request is wrong."""


class ConversionError(ValueError):
    """A checkpoint, config or conversion request that fivefold cannot honour; the message names the culprit."""


class CheckpointWarning(UserWarning):
    """Something in a checkpoint that loads but deserves attention (NaN weights, a dropped `auto_map`)."""
