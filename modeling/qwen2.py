"""Qwen2 (and Qwen2.5): Llama with biases on the query, key and value projections (none on the output), and
sliding attention on the layers `layer_types` marks (from `use_sliding_window` and `max_window_layers`).

The recipe maps the stock `Qwen2Config` fields onto the shared Llama-like recipe; the classes below are one-line
wirings.
"""

from ..configuration.qwen2 import FivefoldQwen2Config
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


def qwen2_recipe(config) -> Recipe:
    return llama_like_recipe(config, bias=True, out_bias=False)


class FivefoldQwen2PreTrainedModel(DecoderPreTrainedModel):
    config: FivefoldQwen2Config
    recipe = staticmethod(qwen2_recipe)


class FivefoldQwen2Model(FivefoldQwen2PreTrainedModel, DecoderModel):
    pass


class FivefoldQwen2ForCausalLM(FivefoldQwen2PreTrainedModel, DecoderForCausalLM):
    base_model_class = FivefoldQwen2Model


class FivefoldQwen2ForSequenceClassification(FivefoldQwen2PreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldQwen2Model


class FivefoldQwen2ForTokenClassification(FivefoldQwen2PreTrainedModel, DecoderForTokenClassification):
    base_model_class = FivefoldQwen2Model


class FivefoldQwen2ForQuestionAnswering(FivefoldQwen2PreTrainedModel, DecoderForQuestionAnswering):
    base_model_class = FivefoldQwen2Model
    transformer = stock_name_of_the_base()
