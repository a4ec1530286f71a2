"""What the configs of the Qwen-style mixtures of experts share (Qwen2-MoE, Qwen3-MoE, OLMoE): the Llama-like
decoder's checks, their experts' checks, and a parallelism plan over per-expert modules."""

from .llama_like import LlamaLikeConfigMixin
from .parallel import tensor_parallel_plan
from .validation import check_positive


class MoEConfigMixin(LlamaLikeConfigMixin):
    # Stock's plans name its fused expert tensors (`mlp.experts.gate_up_proj`); fivefold's experts are separate
    # modules: each is split like a feed-forward layer (expert parallelism: modeling/expert_parallel.py).
    base_model_tp_plan = tensor_parallel_plan("", experts=True)
    base_model_ep_plan = None

    expert_size_field = "moe_intermediate_size"  # the config field of each routed expert's width

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_positive(self, self.expert_size_field, "num_experts", "num_experts_per_tok")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must not exceed num_experts ({self.num_experts})"
            )
