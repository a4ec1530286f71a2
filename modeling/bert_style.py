"""The block of the BERT family's configs (BERT, RoBERTa, ViT): one dense GELU feed-forward, LayerNorm, and the
config fields they share (`hidden_size`, `num_attention_heads`, `intermediate_size`, `hidden_act`, `layer_norm_eps`,
`hidden_dropout_prob`, `attention_probs_dropout_prob`)."""

from .attention import AttentionSpec
from .block import BlockSpec
from .feedforward import FeedForwardSpec


def bert_style_block(config, prenorm: bool, qkv_bias: bool = True) -> BlockSpec:
    return BlockSpec(
        attention=AttentionSpec(
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            bias=qkv_bias,
            dropout=config.attention_probs_dropout_prob,
        ),
        feedforward=FeedForwardSpec(
            kind="dense",
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            activation=config.hidden_act,
        ),
        norm="layernorm",
        norm_eps=config.layer_norm_eps,
        prenorm=prenorm,
        dropout=config.hidden_dropout_prob,
    )
