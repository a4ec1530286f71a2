"""GPT-2 under the `fivefold_gpt2` model type: every field of the stock `GPT2Config` is accepted as is."""

from huggingface_hub.dataclasses import strict
from transformers import GPT2Config

from .base import FivefoldConfigMixin
from .parallel import DECODER_PIPELINE_PLAN, tensor_parallel_plan
from .validation import check_attention_heads, check_positive


@strict(accept_kwargs=True)
class FivefoldGPT2Config(FivefoldConfigMixin, GPT2Config):
    model_type = "fivefold_gpt2"
    base_model_tp_plan = tensor_parallel_plan("")
    base_model_pp_plan = DECODER_PIPELINE_PLAN

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_positive(self, "vocab_size", "n_embd", "n_layer", "n_positions")
        if self.n_inner is not None:
            check_positive(self, "n_inner")
        check_attention_heads(self)
        # Stock GPT-2 options fivefold does not implement: refused rather than silently computed otherwise.
        if self.reorder_and_upcast_attn:
            raise ValueError(
                "reorder_and_upcast_attn=True (stock GPT-2's fp32 q.k product for mixed-precision training in eager "
                "attention) is not supported by fivefold_gpt2"
            )
        if self.add_cross_attention:
            raise ValueError("add_cross_attention=True (GPT-2 as the decoder of an encoder-decoder) is not supported")
