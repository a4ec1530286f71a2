"""Mixtral: RMSNorm pre-norm blocks, rotary positions, grouped-query causal attention (optionally a sliding
window), and a mixture of SwiGLU experts in place of the feed-forward layer.

The recipe maps the stock `MixtralConfig` fields onto shared parts; the classes below are one-line wirings
(the router logits and the load-balancing loss: moe_decoder.py).
"""

from ..configuration.mixtral import FivefoldMixtralConfig
from .decoder import DecoderForQuestionAnswering, DecoderForSequenceClassification, DecoderForTokenClassification
from .llama_like import llama_like_recipe
from .moe import MoESpec
from .moe_decoder import MoEDecoderForCausalLM, MoEDecoderModel, MoEDecoderPreTrainedModel
from .stack import Recipe


def mixtral_experts(config, layer_idx: int) -> MoESpec:
    return MoESpec(
        hidden_size=config.hidden_size,
        expert_size=config.intermediate_size,
        num_experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        activation=config.hidden_act,
        jitter_noise=config.router_jitter_noise,
    )


def mixtral_recipe(config) -> Recipe:
    return llama_like_recipe(config, mixtral_experts)


class FivefoldMixtralPreTrainedModel(MoEDecoderPreTrainedModel):
    config: FivefoldMixtralConfig
    recipe = staticmethod(mixtral_recipe)


class FivefoldMixtralModel(FivefoldMixtralPreTrainedModel, MoEDecoderModel):
    pass


class FivefoldMixtralForCausalLM(FivefoldMixtralPreTrainedModel, MoEDecoderForCausalLM):
    base_model_class = FivefoldMixtralModel


class FivefoldMixtralForSequenceClassification(FivefoldMixtralPreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldMixtralModel


class FivefoldMixtralForTokenClassification(FivefoldMixtralPreTrainedModel, DecoderForTokenClassification):
    base_model_class = FivefoldMixtralModel


class FivefoldMixtralForQuestionAnswering(FivefoldMixtralPreTrainedModel, DecoderForQuestionAnswering):
    base_model_class = FivefoldMixtralModel
