"""Qwen2-MoE (Qwen1.5-MoE): the Llama-like decoder (llama_like.py) with biases on the query, key and value
projections, and in every `decoder_sparse_step`-th layer (but those `mlp_only_layers` lists, which stay dense) a
mixture of SwiGLU experts beside a shared expert that every token runs, scaled by its sigmoid gate.

The recipe maps the stock `Qwen2MoeConfig` fields onto shared parts; the classes below are one-line wirings
(the router logits and the load-balancing loss: moe_decoder.py).
"""

from ..configuration.qwen2_moe import FivefoldQwen2MoeConfig
from .decoder import DecoderForQuestionAnswering, DecoderForSequenceClassification, DecoderForTokenClassification
from .llama_like import llama_like_recipe
from .moe_decoder import (
    MoEDecoderForCausalLM,
    MoEDecoderModel,
    MoEDecoderPreTrainedModel,
    qwen_style_feedforward,
)
from .stack import Recipe


def qwen2_moe_recipe(config) -> Recipe:
    return llama_like_recipe(config, qwen_style_feedforward, bias=config.qkv_bias, out_bias=False)


class FivefoldQwen2MoePreTrainedModel(MoEDecoderPreTrainedModel):
    config: FivefoldQwen2MoeConfig
    recipe = staticmethod(qwen2_moe_recipe)


class FivefoldQwen2MoeModel(FivefoldQwen2MoePreTrainedModel, MoEDecoderModel):
    pass


class FivefoldQwen2MoeForCausalLM(FivefoldQwen2MoePreTrainedModel, MoEDecoderForCausalLM):
    base_model_class = FivefoldQwen2MoeModel


class FivefoldQwen2MoeForSequenceClassification(FivefoldQwen2MoePreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldQwen2MoeModel


class FivefoldQwen2MoeForTokenClassification(FivefoldQwen2MoePreTrainedModel, DecoderForTokenClassification):
    base_model_class = FivefoldQwen2MoeModel


class FivefoldQwen2MoeForQuestionAnswering(FivefoldQwen2MoePreTrainedModel, DecoderForQuestionAnswering):
    base_model_class = FivefoldQwen2MoeModel
