"""Qwen3-MoE: the Llama-like decoder (llama_like.py) with RMSNorm on each head's queries and keys, and a mixture
of SwiGLU experts in every `decoder_sparse_step`-th layer but those `mlp_only_layers` lists, which keep a dense
SwiGLU feed-forward. The router renormalises its top k as `norm_topk_prob` says.

The recipe maps the stock `Qwen3MoeConfig` fields onto shared parts; the classes below are one-line wirings
(the router logits and the load-balancing loss: moe_decoder.py).
"""

from ..configuration.qwen3_moe import FivefoldQwen3MoeConfig
from .decoder import DecoderForQuestionAnswering, DecoderForSequenceClassification, DecoderForTokenClassification
from .llama_like import llama_like_recipe
from .moe_decoder import (
    MoEDecoderForCausalLM,
    MoEDecoderModel,
    MoEDecoderPreTrainedModel,
    qwen_style_feedforward,
)
from .stack import Recipe
from .tasks import stock_name_of_the_base


def qwen3_moe_recipe(config) -> Recipe:
    return llama_like_recipe(config, qwen_style_feedforward, qk_norm="head", qk_norm_eps=config.rms_norm_eps)


class FivefoldQwen3MoePreTrainedModel(MoEDecoderPreTrainedModel):
    config: FivefoldQwen3MoeConfig
    recipe = staticmethod(qwen3_moe_recipe)


class FivefoldQwen3MoeModel(FivefoldQwen3MoePreTrainedModel, MoEDecoderModel):
    pass


class FivefoldQwen3MoeForCausalLM(FivefoldQwen3MoePreTrainedModel, MoEDecoderForCausalLM):
    base_model_class = FivefoldQwen3MoeModel


class FivefoldQwen3MoeForSequenceClassification(FivefoldQwen3MoePreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldQwen3MoeModel


class FivefoldQwen3MoeForTokenClassification(FivefoldQwen3MoePreTrainedModel, DecoderForTokenClassification):
    base_model_class = FivefoldQwen3MoeModel


class FivefoldQwen3MoeForQuestionAnswering(FivefoldQwen3MoePreTrainedModel, DecoderForQuestionAnswering):
    base_model_class = FivefoldQwen3MoeModel
    transformer = stock_name_of_the_base()
