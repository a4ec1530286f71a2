"""Cross-field rules shared by fivefold configs, checked in one place (each raises ValueError naming the fields)."""

import dataclasses
import math
from typing import Any

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# Rope types whose table depends on more than the config: longrope switches factors by length, which fivefold
# does not follow yet.
UNSUPPORTED_ROPE_TYPES = ("longrope",)


def check_positive(config: Any, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_attention_heads(config: Any) -> None:
    hidden, heads = config.hidden_size, config.num_attention_heads
    if not isinstance(heads, int) or heads <= 0 or hidden % heads != 0:
        raise ValueError(f"hidden_size ({hidden}) must be a positive multiple of num_attention_heads ({heads})")


def check_rope_type(rope_type: str) -> None:
    """fivefold computes rotary tables with transformers' own rope functions: any of them but UNSUPPORTED_ROPE_TYPES."""
    supported = ["default", *(t for t in ROPE_INIT_FUNCTIONS if t not in UNSUPPORTED_ROPE_TYPES)]
    if rope_type not in supported:
        raise ValueError(f"rope_type {rope_type!r} is not supported by fivefold; supported: {', '.join(supported)}")


def check_grouped_heads(config: Any) -> None:
    if config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(
            f"num_key_value_heads ({config.num_key_value_heads}) must divide num_attention_heads "
            f"({config.num_attention_heads}): each key/value head serves a whole group of query heads"
        )


def check_grouped_heads_and_experts(config: Any) -> None:
    """A mixture-of-experts decoder's rules: key/value heads serve whole groups, no more experts per token than
    there are."""
    check_grouped_heads(config)
    if config.num_experts_per_tok > config.num_local_experts:
        raise ValueError(
            f"num_experts_per_tok ({config.num_experts_per_tok}) must not exceed num_local_experts "
            f"({config.num_local_experts})"
        )


def declared(config, name: str, default=None):
    """`config.<name>` where the config's class declares that field, else `default`. A config.json may carry
    fields of another architecture (a Llama converted from a Mistral keeps its `sliding_window`): transformers
    keeps them as attributes, and stock's model builds nothing from them (its masks, biases and checks)."""
    if dataclasses.is_dataclass(config) and name not in {f.name for f in dataclasses.fields(config)}:
        return default
    return getattr(config, name, default)


def check_llama_like(config: Any) -> None:
    """The rules of a Llama-like decoder (modeling/llama_like.py): sizes positive, heads of a width that divides
    (or a head_dim of its own), key/value heads dividing the query heads, a supported rope type, and a positive
    sliding window wherever a layer slides."""
    check_positive(config, "vocab_size", "hidden_size", "num_hidden_layers", "num_key_value_heads")
    if getattr(config, "head_dim", None) is None:
        check_attention_heads(config)
    else:
        check_positive(config, "head_dim", "num_attention_heads")
    check_grouped_heads(config)
    check_rope_type((config.rope_parameters or {}).get("rope_type", "default"))
    layer_types = declared(config, "layer_types")
    if layer_types is not None and len(layer_types) != config.num_hidden_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {config.num_hidden_layers} layers")
    if declared(config, "sliding_window") is not None:
        check_positive(config, "sliding_window")
    elif "sliding_attention" in (layer_types or ()):
        raise ValueError("layer_types has sliding_attention layers, and sliding_window is None")


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


# No tensor dimension of a real model reaches 2**31, nor a count of layers or experts 2**16: past these a
# config asks for work no checkpoint could back, refused before anything is built.
MAX_SIZE = 2**31 - 1
MAX_COUNT = 2**16
COUNT_FIELDS = ("num_hidden_layers", "num_layers", "num_decoder_layers", "n_layer", "num_local_experts", "num_labels")
ACTIVATION_FIELDS = ("hidden_act", "activation_function", "hidden_activation", "classifier_activation",
                     "dense_act_fn", "pooler_act", "summary_activation")  # fmt: skip


def _shown(value: int) -> str:
    return str(value) if abs(value) < 10**15 else f"about 2**{value.bit_length()}"


def check_sizes(fields: dict) -> None:
    """Every integer (or pair of integers) among the config's fields within MAX_SIZE, every count within MAX_COUNT."""
    for name, value in fields.items():
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            if not isinstance(v, int) or isinstance(v, bool):
                continue
            limit = MAX_COUNT if name in COUNT_FIELDS else MAX_SIZE
            if abs(v) > limit:
                raise ValueError(f"{name} is {_shown(v)}, past {limit}, the largest fivefold builds")


def check_rates_and_norms(config: Any) -> None:
    """Dropout rates are probabilities, activations are transformers' names, norm epsilons finite and >= 0."""
    from transformers.activations import ACT2FN

    for name, value in vars(config).items():
        is_rate = "dropout" in name or name.endswith("pdrop")
        if is_rate and value is not None and (not isinstance(value, int | float) or not 0 <= value <= 1):
            raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
        if name.endswith(("_eps", "_epsilon")) and (not isinstance(value, int | float) or not 0 <= value < math.inf):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    for name in ACTIVATION_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, str) and value not in ACT2FN:
            valid = ", ".join(sorted(ACT2FN))
            raise ValueError(f"{name} {value!r} is not an activation transformers knows; valid: {valid}")
