"""T5: relative position buckets, unscaled attention, RMS norms before each sub-layer, ReLU (v1.0) or gated-GELU
(v1.1, FLAN) feed-forwards, and a decoder that cross-attends the encoder in every layer.

The recipe maps the stock `T5Config` fields onto shared parts; the classes below are one-line wirings, plus
T5's own initialisation scales.
"""

import dataclasses

from torch import nn
from transformers import initialization as init

from ..configuration.t5 import FivefoldT5Config
from .attention import AttentionSpec
from .block import BlockSpec
from .embeddings import EmbeddingSpec
from .encoder_decoder import (
    EncoderDecoderForConditionalGeneration,
    EncoderDecoderModel,
    EncoderDecoderPreTrainedModel,
    EncoderDecoderRecipe,
    EncoderDecoderStack,
    EncoderOnlyModel,
)
from .feedforward import FeedForwardSpec
from .heads import HeadSpec
from .initialization import WeightInit, mark_projections, with_init
from .norms import RMSNorm
from .relative_position import RelativeBiasSpec, RelativePositionBias
from .stack import StackSpec


def t5_stack(config, num_layers: int, causal: bool) -> StackSpec:
    attention = AttentionSpec(
        hidden_size=config.d_model,
        num_heads=config.num_heads,
        head_dim=config.d_kv,
        bias=False,
        out_bias=False,
        dropout=config.dropout_rate,
        is_causal=causal,
        scaling=1.0,  # T5 folds 1/sqrt(d) into its initialisation
    )
    block = BlockSpec(
        attention=attention,
        feedforward=FeedForwardSpec(
            kind="gated" if config.is_gated_act else "dense",
            hidden_size=config.d_model,
            intermediate_size=config.d_ff,
            activation=config.dense_act_fn,
            bias=False,
            dropout=config.dropout_rate,
            down_in_weight_dtype=True,  # `wo` kept in fp32 under fp16, as stock's
        ),
        norm="rmsnorm",
        norm_eps=config.layer_norm_epsilon,
        prenorm=True,
        dropout=config.dropout_rate,
        cross_attention=dataclasses.replace(attention, is_causal=False) if causal else None,
        clamp_fp16=True,
    )
    return StackSpec(
        embeddings=EmbeddingSpec(vocab_size=config.vocab_size, hidden_size=config.d_model, dropout=config.dropout_rate),
        blocks=(block,) * num_layers,
        norm="rmsnorm",
        norm_eps=config.layer_norm_epsilon,
        dropout=config.dropout_rate,
        relative_bias=RelativeBiasSpec(
            num_heads=config.num_heads,
            num_buckets=config.relative_attention_num_buckets,
            max_distance=config.relative_attention_max_distance,
            bidirectional=not causal,
        ),
    )


def t5_recipe(config) -> EncoderDecoderRecipe:
    return EncoderDecoderRecipe(
        encoder=t5_stack(config, config.num_layers, causal=False),
        decoder=t5_stack(config, config.num_decoder_layers, causal=True),
        heads={"seq2seq_lm": HeadSpec(at="lm_head", bias=False)},
        # v1.0 ties the head to the embeddings and rescales; v1.1 (tie_word_embeddings false) does not.
        logits_scale=config.d_model**-0.5 if config.scale_decoder_outputs else 1.0,
    )


class FivefoldT5PreTrainedModel(EncoderDecoderPreTrainedModel):
    config: FivefoldT5Config
    recipe = staticmethod(t5_recipe)
    # fp16 overflows in the last feed-forward projection of large T5s (stock keeps `wo` in fp32 likewise).
    _keep_in_fp32_modules = ["mlp.down_proj"]
    # The layout before fivefold 0.2 named each stack's final norm `final_norm` and its word table `embed_tokens`.
    _renamed_keys = {
        r"^(encoder|decoder)\.final_norm\.": r"\1.norm.",
        r"^(encoder|decoder)\.embed_tokens\.": r"\1.embeddings.word_embeddings.",
    }

    def post_init(self) -> None:
        """T5's scales (mesh-tensorflow): unit embeddings, projections by fan-in, scaled by `initializer_factor`.
        Each projection is marked with its scale before initialisation (initialization.py says why a rule on the
        attention or feed-forward layer would never run)."""
        c, factor = self.config, self.config.initializer_factor
        fan_in_model, fan_in_ff = WeightInit(factor * c.d_model**-0.5), WeightInit(factor * c.d_ff**-0.5)
        mark_projections(
            self,
            query=WeightInit(factor * (c.d_model * c.d_kv) ** -0.5),
            key_value=fan_in_model,
            attn_out=WeightInit(factor * (c.num_heads * c.d_kv) ** -0.5),
            mlp_in=fan_in_model,
            mlp_out=fan_in_ff,
        )
        for module in self.modules():
            if isinstance(module, RelativePositionBias):
                with_init(module.relative_attention_bias, fan_in_model)
        super().post_init()

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        factor = self.config.initializer_factor
        if isinstance(module, RMSNorm):
            init.constant_(module.weight, factor)
        elif isinstance(module, nn.Embedding) and getattr(module, "weight_init", None) is None:
            init.normal_(module.weight, std=factor)
        elif isinstance(module, EncoderDecoderForConditionalGeneration) and not self.config.scale_decoder_outputs:
            init.normal_(module.lm_head.weight, std=factor)


class FivefoldT5Stack(FivefoldT5PreTrainedModel, EncoderDecoderStack):
    pass


class FivefoldT5Model(FivefoldT5PreTrainedModel, EncoderDecoderModel):
    stack_class = FivefoldT5Stack


class FivefoldT5ForConditionalGeneration(FivefoldT5PreTrainedModel, EncoderDecoderForConditionalGeneration):
    stack_class = FivefoldT5Stack


class FivefoldT5EncoderModel(FivefoldT5PreTrainedModel, EncoderOnlyModel):
    stack_class = FivefoldT5Stack
