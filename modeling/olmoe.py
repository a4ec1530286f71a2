"""OLMoE: the Llama-like decoder (llama_like.py) with RMSNorm over the full query and key projections (across
the heads, not per head), and a mixture of SwiGLU experts in every layer; the router renormalises its top k as
`norm_topk_prob` says. Stock has a causal LM head only, and so has this.

The recipe maps the stock `OlmoeConfig` fields onto shared parts; the classes below are one-line wirings
(the router logits and the load-balancing loss: moe_decoder.py).
"""

from ..configuration.olmoe import FivefoldOlmoeConfig
from .llama_like import decoder_heads, llama_like_recipe
from .moe import MoESpec
from .moe_decoder import MoEDecoderForCausalLM, MoEDecoderModel, MoEDecoderPreTrainedModel, qwen_style_experts
from .stack import Recipe


def olmoe_experts(config, layer_idx: int) -> MoESpec:
    return qwen_style_experts(config, config.intermediate_size)


def olmoe_recipe(config) -> Recipe:
    heads = {"causal_lm": decoder_heads(config)["causal_lm"]}
    return llama_like_recipe(config, olmoe_experts, heads, qk_norm="width", qk_norm_eps=config.rms_norm_eps)


class FivefoldOlmoePreTrainedModel(MoEDecoderPreTrainedModel):
    config: FivefoldOlmoeConfig
    recipe = staticmethod(olmoe_recipe)


class FivefoldOlmoeModel(FivefoldOlmoePreTrainedModel, MoEDecoderModel):
    pass


class FivefoldOlmoeForCausalLM(FivefoldOlmoePreTrainedModel, MoEDecoderForCausalLM):
    base_model_class = FivefoldOlmoeModel
