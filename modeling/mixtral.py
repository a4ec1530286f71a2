"""Mixtral: RMSNorm pre-norm blocks, rotary positions, grouped-query causal attention (optionally a sliding
window), and a mixture of SwiGLU experts in place of the feed-forward layer.

The recipe maps the stock `MixtralConfig` fields onto shared parts; the classes below are one-line wirings
(the router logits and the load-balancing loss: moe_decoder.py).
"""

from ..configuration.mixtral import FivefoldMixtralConfig
from .attention import AttentionSpec
from .block import BlockSpec
from .decoder import DecoderForSequenceClassification
from .embeddings import EmbeddingSpec
from .heads import HeadSpec
from .moe import MoESpec
from .moe_decoder import MoEDecoderForCausalLM, MoEDecoderModel, MoEDecoderPreTrainedModel
from .stack import Recipe, StackSpec


def mixtral_recipe(config) -> Recipe:
    block = BlockSpec(
        attention=AttentionSpec(
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim or config.hidden_size // config.num_attention_heads,
            bias=False,
            out_bias=False,
            dropout=config.attention_dropout,
            is_causal=True,
            positions="rotary",
            rotary_theta=config.rope_parameters["rope_theta"],
            # `sliding_window` counts the query itself: keys up to sliding_window - 1 positions before it.
            window=config.sliding_window - 1 if config.sliding_window is not None else None,
        ),
        feedforward=MoESpec(
            hidden_size=config.hidden_size,
            expert_size=config.intermediate_size,
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            activation=config.hidden_act,
            jitter_noise=config.router_jitter_noise,
        ),
        norm="rmsnorm",
        norm_eps=config.rms_norm_eps,
        prenorm=True,
    )
    return Recipe(
        stack=StackSpec(
            embeddings=EmbeddingSpec(
                vocab_size=config.vocab_size, hidden_size=config.hidden_size, padding_idx=config.pad_token_id
            ),
            blocks=(block,) * config.num_hidden_layers,
            norm="rmsnorm",
            norm_eps=config.rms_norm_eps,
        ),
        heads={
            "causal_lm": HeadSpec(at="lm_head", bias=False),
            "sequence_classification": HeadSpec(at="score", bias=False),
        },
    )


class FivefoldMixtralPreTrainedModel(MoEDecoderPreTrainedModel):
    config: FivefoldMixtralConfig
    recipe = staticmethod(mixtral_recipe)


class FivefoldMixtralModel(FivefoldMixtralPreTrainedModel, MoEDecoderModel):
    pass


class FivefoldMixtralForCausalLM(FivefoldMixtralPreTrainedModel, MoEDecoderForCausalLM):
    base_model_class = FivefoldMixtralModel


class FivefoldMixtralForSequenceClassification(FivefoldMixtralPreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldMixtralModel
