"""gpt-oss under the `fivefold_gpt_oss` model type: every field of the stock `GptOssConfig` is accepted as is
(`layer_types` sliding/full per layer, yarn `rope_parameters`, `swiglu_limit`/`swiglu_alpha`), plus
`router_z_loss_coef` (ST-MoE's router z-loss, off by default)."""

from huggingface_hub.dataclasses import strict
from transformers import GptOssConfig

from .base import FivefoldConfigMixin
from .offload import ExpertOffloadFields
from .parallel import DECODER_PIPELINE_PLAN, GATHERED_ATTENTION, tensor_parallel_plan
from .validation import check_grouped_heads_and_experts, check_positive

LAYER_TYPES = ("sliding_attention", "full_attention")


@strict(accept_kwargs=True)
class FivefoldGptOssConfig(FivefoldConfigMixin, ExpertOffloadFields, GptOssConfig):
    model_type = "fivefold_gpt_oss"
    # Stock's plans name its fused expert tensors (`mlp.experts.gate_up_proj`); fivefold's experts are separate
    # modules, each split like a feed-forward layer (expert parallelism: modeling/expert_parallel.py). The sinks
    # are one parameter of all heads, read whole by the attention: every rank gathers q/k/v and attends all heads.
    base_model_tp_plan = tensor_parallel_plan("", experts=True, attention=GATHERED_ATTENTION)
    base_model_ep_plan = None
    base_model_pp_plan = DECODER_PIPELINE_PLAN

    router_z_loss_coef: float = 0.0

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_positive(
            self,
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "num_local_experts",
            "num_experts_per_tok",
        )
        check_grouped_heads_and_experts(self)
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= set(LAYER_TYPES):
            raise ValueError(
                f"layer_types must name one of {', '.join(LAYER_TYPES)} for each of the {self.num_hidden_layers} "
                f"layers, got {self.layer_types!r}"
            )
        if "sliding_attention" in self.layer_types:
            check_positive(self, "sliding_window")
        if self.swiglu_limit is not None and not self.swiglu_limit > 0:
            raise ValueError(f"swiglu_limit must be a positive number, got {self.swiglu_limit!r}")
