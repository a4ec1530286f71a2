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


def pair(value: Any, name: str) -> tuple[int, int]:
    """An int or a [height, width] pair (as ViT's image_size and patch_size may be) as (height, width)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    raise ValueError(f"{name} must be an int or a [height, width] pair of ints, got {value!r}")


def check_vision_encoder(config: Any) -> None:
    """The ViT-family rules: sizes positive, heads divide the width, whole patches tile the image."""
    check_positive(config, "hidden_size", "num_hidden_layers", "intermediate_size", "num_channels")
    check_attention_heads(config)
    image, patch = pair(config.image_size, "image_size"), pair(config.patch_size, "patch_size")
    if min(*image, *patch) <= 0:
        raise ValueError(f"image_size ({config.image_size}) and patch_size ({config.patch_size}) must be positive")
    if image[0] % patch[0] or image[1] % patch[1]:
        raise ValueError(
            f"patch_size ({config.patch_size}) must divide image_size ({config.image_size}): "
            "the position table holds one entry per whole patch"
        )
    if config.pooler_output_size is not None:
        check_positive(config, "pooler_output_size")
