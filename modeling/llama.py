"""Llama: the Llama-like decoder as is (RMSNorm pre-norm, rotary scaled as `rope_parameters` say, grouped-query
causal attention, SwiGLU); `attention_bias` and `mlp_bias` put biases on all four attention projections and on
the feed-forward.

The recipe maps the stock `LlamaConfig` fields onto the shared Llama-like recipe; the classes below are one-line
wirings.
"""

from ..configuration.llama import FivefoldLlamaConfig
from .decoder import (
    DecoderForCausalLM,
    DecoderForQuestionAnswering,
    DecoderForSequenceClassification,
    DecoderForTokenClassification,
    DecoderModel,
    DecoderPreTrainedModel,
)
from .llama_like import llama_like_recipe
from .stack import Recipe
from .tasks import stock_name_of_the_base


def llama_recipe(config) -> Recipe:
    return llama_like_recipe(config)


class FivefoldLlamaPreTrainedModel(DecoderPreTrainedModel):
    config: FivefoldLlamaConfig
    recipe = staticmethod(llama_recipe)


class FivefoldLlamaModel(FivefoldLlamaPreTrainedModel, DecoderModel):
    pass


class FivefoldLlamaForCausalLM(FivefoldLlamaPreTrainedModel, DecoderForCausalLM):
    base_model_class = FivefoldLlamaModel


class FivefoldLlamaForSequenceClassification(FivefoldLlamaPreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldLlamaModel


class FivefoldLlamaForTokenClassification(FivefoldLlamaPreTrainedModel, DecoderForTokenClassification):
    base_model_class = FivefoldLlamaModel


class FivefoldLlamaForQuestionAnswering(FivefoldLlamaPreTrainedModel, DecoderForQuestionAnswering):
    base_model_class = FivefoldLlamaModel
    transformer = stock_name_of_the_base()
