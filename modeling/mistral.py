"""Mistral: Llama with one sliding window (`sliding_window`, counting the query itself) on every layer.

The recipe maps the stock `MistralConfig` fields onto the shared Llama-like recipe; the classes below are one-line
wirings.
"""

from ..configuration.mistral import FivefoldMistralConfig
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


def mistral_recipe(config) -> Recipe:
    return llama_like_recipe(config)


class FivefoldMistralPreTrainedModel(DecoderPreTrainedModel):
    config: FivefoldMistralConfig
    recipe = staticmethod(mistral_recipe)


class FivefoldMistralModel(FivefoldMistralPreTrainedModel, DecoderModel):
    pass


class FivefoldMistralForCausalLM(FivefoldMistralPreTrainedModel, DecoderForCausalLM):
    base_model_class = FivefoldMistralModel


class FivefoldMistralForSequenceClassification(FivefoldMistralPreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldMistralModel


class FivefoldMistralForTokenClassification(FivefoldMistralPreTrainedModel, DecoderForTokenClassification):
    base_model_class = FivefoldMistralModel


class FivefoldMistralForQuestionAnswering(FivefoldMistralPreTrainedModel, DecoderForQuestionAnswering):
    base_model_class = FivefoldMistralModel
