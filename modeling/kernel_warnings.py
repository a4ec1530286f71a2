"""What stock's attention kernels say, said where fivefold's own kernels run instead of them."""

from transformers.utils import logging

# Under transformers' logger, so that its verbosity silences these as it does stock's.
logger = logging.get_logger(f"transformers.{__name__}")


def warn_no_attention_weights(config, asked: bool | None) -> None:
    """What transformers' sdpa kernel says when asked for attention weights, said where fivefold's own kernels run
    instead of it (unpadded sequences) or never see the request (decoders)."""
    if asked and config._attn_implementation == "sdpa":
        logger.warning_once(
            "`sdpa` attention does not support `output_attentions=True`. Please set your attention to `eager` if "
            "you want any of these features."
        )
