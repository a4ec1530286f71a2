"""Cross-field rules shared by fivefold configs, checked in one place (each raises ValueError naming the fields)."""

from typing import Any


def check_positive(config: Any, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_attention_heads(config: Any) -> None:
    hidden, heads = config.hidden_size, config.num_attention_heads
    if not isinstance(heads, int) or heads <= 0 or hidden % heads != 0:
        raise ValueError(f"hidden_size ({hidden}) must be a positive multiple of num_attention_heads ({heads})")


def check_text_encoder(config: Any) -> None:
    """The BERT-family rules: sizes positive, heads divide the width, no decoder or cross-attention flags."""
    check_positive(
        config,
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
    )
    check_attention_heads(config)
    if config.is_decoder or config.add_cross_attention:
        raise ValueError(f"{config.model_type} is an encoder: is_decoder and add_cross_attention must be false")
