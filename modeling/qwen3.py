"""Qwen3: Llama with RMSNorm on each head's queries and keys (`q_norm`/`k_norm` over head_dim, before rotary) and
sliding attention on the layers `layer_types` marks.

The recipe maps the stock `Qwen3Config` fields onto the shared Llama-like recipe; the classes below are one-line
wirings.
"""

from ..configuration.qwen3 import FivefoldQwen3Config
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


def qwen3_recipe(config) -> Recipe:
    return llama_like_recipe(config, qk_norm="head", qk_norm_eps=config.rms_norm_eps)


class FivefoldQwen3PreTrainedModel(DecoderPreTrainedModel):
    config: FivefoldQwen3Config
    recipe = staticmethod(qwen3_recipe)


class FivefoldQwen3Model(FivefoldQwen3PreTrainedModel, DecoderModel):
    pass


class FivefoldQwen3ForCausalLM(FivefoldQwen3PreTrainedModel, DecoderForCausalLM):
    base_model_class = FivefoldQwen3Model


class FivefoldQwen3ForSequenceClassification(FivefoldQwen3PreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldQwen3Model


class FivefoldQwen3ForTokenClassification(FivefoldQwen3PreTrainedModel, DecoderForTokenClassification):
    base_model_class = FivefoldQwen3Model


class FivefoldQwen3ForQuestionAnswering(FivefoldQwen3PreTrainedModel, DecoderForQuestionAnswering):
    base_model_class = FivefoldQwen3Model
    transformer = stock_name_of_the_base()
