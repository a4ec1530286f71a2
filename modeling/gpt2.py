"""GPT-2: learned absolute positions, pre-norm blocks, GELU (tanh) feed-forward, causal attention, LM head tied
to the word embeddings. Token types, where given, are embedded with the word table as in stock.

The recipe maps the stock `GPT2Config` fields onto shared parts; the classes below are one-line wirings.
"""

import math

import torch
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions, CausalLMOutputWithCrossAttentions

from ..configuration.gpt2 import FivefoldGPT2Config
from .attention import CROSS_ATTENTIONS_RECORD, AttentionSpec
from .block import BlockSpec
from .decoder import (
    DecoderForCausalLM,
    DecoderForSequenceClassification,
    DecoderForTokenClassification,
    DecoderModel,
    DecoderPreTrainedModel,
)
from .embeddings import EmbeddingSpec
from .feedforward import FeedForwardSpec
from .heads import HeadSpec, token_classifier_dropout
from .initialization import WeightInit, mark_projections
from .stack import Recipe, StackSpec
from .tasks import stock_name_of_the_base

# The same function as one fused kernel: "gelu_new" is the tanh GELU written as seven elementwise ops, each a
# separate dispatch on every layer of every decoding step.
FUSED_EQUIVALENTS = {"gelu_new": "gelu_pytorch_tanh"}


def gpt2_attention_scale(config, layer_idx: int) -> float:
    """Stock's scaling options: 1/sqrt(head_dim) unless scale_attn_weights is off, and optionally 1/(layer + 1)."""
    scale = (config.n_embd // config.n_head) ** -0.5 if config.scale_attn_weights else 1.0
    return scale / (layer_idx + 1) if config.scale_attn_by_inverse_layer_idx else scale


def gpt2_recipe(config) -> Recipe:
    def block(layer_idx: int) -> BlockSpec:
        return BlockSpec(
            attention=AttentionSpec(
                hidden_size=config.n_embd,
                num_heads=config.n_head,
                dropout=config.attn_pdrop,
                is_causal=True,
                scaling=gpt2_attention_scale(config, layer_idx),
            ),
            feedforward=FeedForwardSpec(
                kind="dense",
                hidden_size=config.n_embd,
                intermediate_size=config.n_inner if config.n_inner is not None else 4 * config.n_embd,
                activation=FUSED_EQUIVALENTS.get(config.activation_function, config.activation_function),
            ),
            norm="layernorm",
            norm_eps=config.layer_norm_epsilon,
            prenorm=True,
            dropout=config.resid_pdrop,
        )

    return Recipe(
        stack=StackSpec(
            embeddings=EmbeddingSpec(
                vocab_size=config.vocab_size,
                hidden_size=config.n_embd,
                max_positions=config.n_positions,
                token_types_from_words=True,
                dropout=config.embd_pdrop,
            ),
            blocks=tuple(block(i) for i in range(config.n_layer)),
            norm="layernorm",
            norm_eps=config.layer_norm_epsilon,
        ),
        heads={
            "causal_lm": HeadSpec(at="lm_head", bias=False),
            "sequence_classification": HeadSpec(at="score", bias=False),
            "token_classification": HeadSpec(dropout=token_classifier_dropout(config), at="classifier"),
        },
    )


class FivefoldGPT2PreTrainedModel(DecoderPreTrainedModel):
    config: FivefoldGPT2Config
    transformer = stock_name_of_the_base()
    recipe = staticmethod(gpt2_recipe)
    _can_record_outputs = {**DecoderPreTrainedModel._can_record_outputs, **CROSS_ATTENTIONS_RECORD}

    def post_init(self) -> None:
        # GPT-2's scheme: the projections writing into the residual stream start smaller, by 1/sqrt(2 n_layer).
        residual = WeightInit(self.config.initializer_range / math.sqrt(2 * self.config.n_layer))
        mark_projections(self, attn_out=residual, mlp_out=residual)
        super().post_init()


class FivefoldGPT2Model(FivefoldGPT2PreTrainedModel, DecoderModel):
    output_class = BaseModelOutputWithPastAndCrossAttentions


class FivefoldGPT2LMHeadModel(FivefoldGPT2PreTrainedModel, DecoderForCausalLM):
    base_model_class = FivefoldGPT2Model
    output_class = CausalLMOutputWithCrossAttentions

    def auxiliary_outputs(self, outputs, attention_mask: torch.Tensor | None) -> tuple[None, dict]:
        return None, {"cross_attentions": outputs.cross_attentions}


class FivefoldGPT2ForSequenceClassification(FivefoldGPT2PreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldGPT2Model


class FivefoldGPT2ForTokenClassification(FivefoldGPT2PreTrainedModel, DecoderForTokenClassification):
    base_model_class = FivefoldGPT2Model
