"""Mixtral under the `fivefold_mixtral` model type: every field of the stock `MixtralConfig` is accepted as is,
plus `router_z_loss_coef` (ST-MoE's router z-loss, off by default)."""

from huggingface_hub.dataclasses import strict
from transformers import MixtralConfig

from .base import FivefoldConfigMixin
from .offload import ExpertOffloadFields
from .parallel import DECODER_PIPELINE_PLAN, tensor_parallel_plan
from .validation import check_llama_like, check_positive


@strict(accept_kwargs=True)
class FivefoldMixtralConfig(FivefoldConfigMixin, ExpertOffloadFields, MixtralConfig):
    model_type = "fivefold_mixtral"
    # Stock's parallelism plans name its fused expert tensors (`mlp.experts.gate_up_proj`); fivefold's experts
    # are separate modules: each is split like a feed-forward layer (expert parallelism: modeling/expert_parallel.py).
    base_model_tp_plan = tensor_parallel_plan("", experts=True)
    base_model_ep_plan = None
    base_model_pp_plan = DECODER_PIPELINE_PLAN

    router_z_loss_coef: float = 0.0

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_llama_like(self)
        check_positive(self, "intermediate_size", "num_local_experts", "num_experts_per_tok")
        if self.num_experts_per_tok > self.num_local_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must not exceed num_local_experts "
                f"({self.num_local_experts})"
            )
