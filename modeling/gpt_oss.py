"""gpt-oss: Mixtral's decoder with learned attention sinks, biases on every attention projection, sliding and full
attention alternating by `layer_types`, yarn rotary positions, a biased router whose top k logits are softmaxed
among themselves, and experts with biases and a clamped SwiGLU.

The recipe maps the stock `GptOssConfig` fields onto shared parts; the classes below are one-line wirings. The
router logits are recorded and turned into the load-balancing loss exactly as for Mixtral.
"""

from transformers import initialization as init

from ..configuration.gpt_oss import FivefoldGptOssConfig
from .attention import Attention
from .decoder import DecoderForSequenceClassification, DecoderForTokenClassification
from .llama_like import decoder_heads, llama_like_recipe
from .moe import MoESpec
from .moe_decoder import MoEDecoderForCausalLM, MoEDecoderModel, MoEDecoderPreTrainedModel
from .routers import TopKRouter
from .stack import Recipe


def gpt_oss_experts(config, layer_idx: int) -> MoESpec:
    return MoESpec(
        hidden_size=config.hidden_size,
        expert_size=config.intermediate_size,
        num_experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        routing="top_k_softmax",
        router_bias=True,
        expert="clamped_swiglu",
        expert_bias=True,
        swiglu_limit=config.swiglu_limit,
        swiglu_alpha=config.swiglu_alpha,
    )


def gpt_oss_recipe(config) -> Recipe:
    heads = {task: head for task, head in decoder_heads(config).items() if task != "question_answering"}
    # q/k/v and the output projection all biased (`attention_bias`), as the shared builder reads it.
    return llama_like_recipe(config, gpt_oss_experts, heads=heads, norm="rmsnorm_weighted_in_fp32", sinks=True)


class FivefoldGptOssPreTrainedModel(MoEDecoderPreTrainedModel):
    config: FivefoldGptOssConfig
    recipe = staticmethod(gpt_oss_recipe)
    # Blocks may be split so that one layer's experts land on different devices; every expert stays whole.
    _no_split_modules = ["TokenEmbeddings", "Attention", "ClampedSwiGLU"]
    # Stock's: the norms' weights stay fp32 in an fp16 model (every norm: those of each block and the last).
    _keep_in_fp32_modules = ["norm"]
    # Stock's: the flash kernels that take attention sinks.
    _compatible_flash_implementations = [
        "kernels-community/vllm-flash-attn3",
        "flash_attention_4",
        "kernels-community/metal-flash-sdpa",
        "kernels-community/aiter-flash-attn",
    ]

    def _init_weights(self, module) -> None:
        super()._init_weights(module)
        # As stock draws them: sinks and the router's bias ~ N(0, initializer_range) (a linear's bias starts at 0).
        std = self.config.initializer_range
        if isinstance(module, Attention) and hasattr(module, "sinks"):
            init.normal_(module.sinks, mean=0.0, std=std)
        if isinstance(module, TopKRouter) and module.bias is not None:
            init.normal_(module.bias, mean=0.0, std=std)


class FivefoldGptOssModel(FivefoldGptOssPreTrainedModel, MoEDecoderModel):
    pass


class FivefoldGptOssForCausalLM(FivefoldGptOssPreTrainedModel, MoEDecoderForCausalLM):
    base_model_class = FivefoldGptOssModel


class FivefoldGptOssForSequenceClassification(FivefoldGptOssPreTrainedModel, DecoderForSequenceClassification):
    base_model_class = FivefoldGptOssModel


class FivefoldGptOssForTokenClassification(FivefoldGptOssPreTrainedModel, DecoderForTokenClassification):
    base_model_class = FivefoldGptOssModel
