"""The recipe every Llama-like decoder shares: RMSNorm pre-norm blocks, rotary positions (scaled as the config's
`rope_parameters` say), grouped-query causal attention, each layer full or sliding as `layer_types` (or one
`sliding_window` for all) says, and a gated SwiGLU feed-forward unless the caller passes another.

An architecture's recipe is this builder with the parts it changes: attention fields (q/k/v bias, query/key
norms) and, for a mixture of experts, the feed-forward of each layer.
"""

from collections.abc import Callable

from ..configuration.validation import declared
from .attention import AttentionSpec
from .block import BlockSpec
from .embeddings import EmbeddingSpec
from .feedforward import FeedForwardSpec
from .heads import HeadSpec, token_classifier_dropout
from .moe import MoESpec
from .stack import Recipe, StackSpec


def decoder_heads(config) -> dict[str, HeadSpec]:
    """Every head a Llama-like decoder has, named as stock names them."""
    return {
        "causal_lm": HeadSpec(at="lm_head", bias=False),
        "sequence_classification": HeadSpec(at="score", bias=False),
        "token_classification": HeadSpec(dropout=token_classifier_dropout(config), at="score"),
        "question_answering": HeadSpec(at="qa_outputs"),
    }


def layer_window(config, layer_idx: int) -> int | None:
    """The sliding window of one layer, as the attention's `window` counts it (keys before the query), or None.
    `sliding_window` counts the query itself. Layers are sliding where `layer_types` says so; without
    `layer_types`, every layer is sliding when the config has a `sliding_window` (Mistral, Mixtral)."""
    sliding_window = declared(config, "sliding_window")
    layer_types = declared(config, "layer_types")
    if layer_types is not None and layer_types[layer_idx] != "sliding_attention":
        return None
    if sliding_window is None:
        if layer_types is not None:
            raise ValueError(f"layer {layer_idx} is a sliding_attention layer, and the config has no sliding_window")
        return None
    return sliding_window - 1


def gated_feedforward(config, layer_idx: int) -> FeedForwardSpec:
    return FeedForwardSpec(
        kind="gated",
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        activation=config.hidden_act,
        bias=declared(config, "mlp_bias", False),
    )


def decoder_attention(config, layer_idx: int, **fields) -> AttentionSpec:
    """The attention of one layer from the stock config's fields; `fields` override them (`bias`, `qk_norm`, ...)."""
    rope = config.rope_parameters
    bias = declared(config, "attention_bias", False)
    spec = dict(
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        bias=bias,
        out_bias=bias,
        dropout=config.attention_dropout,
        is_causal=True,
        positions="rotary",
        rotary_theta=rope["rope_theta"],
        rope_type=rope.get("rope_type", "default"),
        window=layer_window(config, layer_idx),
    )
    return AttentionSpec(**{**spec, **fields})


def llama_like_recipe(
    config,
    feedforward: Callable[..., FeedForwardSpec | MoESpec] = gated_feedforward,  # (config, layer index) -> spec
    heads: dict[str, HeadSpec] | None = None,  # None: decoder_heads(config)
    norm: str = "rmsnorm",
    **attention_fields,  # AttentionSpec fields over decoder_attention's (e.g. qk_norm="head")
) -> Recipe:
    blocks = tuple(
        BlockSpec(
            attention=decoder_attention(config, i, **attention_fields),
            feedforward=feedforward(config, i),
            norm=norm,
            norm_eps=config.rms_norm_eps,
            prenorm=True,
        )
        for i in range(config.num_hidden_layers)
    )
    return Recipe(
        stack=StackSpec(
            embeddings=EmbeddingSpec(
                vocab_size=config.vocab_size, hidden_size=config.hidden_size, padding_idx=config.pad_token_id
            ),
            blocks=blocks,
            norm=norm,
            norm_eps=config.rms_norm_eps,
        ),
        heads=decoder_heads(config) if heads is None else heads,
    )
