"""Qwen2-MoE (Qwen1.5-MoE) under the `fivefold_qwen2_moe` model type: every field of the stock `Qwen2MoeConfig`
is accepted as is, plus `router_z_loss_coef` (ST-MoE's router z-loss, off by default)."""

from huggingface_hub.dataclasses import strict
from transformers import Qwen2MoeConfig

from .moe import MoEConfigMixin
from .offload import ExpertOffloadFields
from .validation import check_positive


@strict(accept_kwargs=True)
class FivefoldQwen2MoeConfig(MoEConfigMixin, ExpertOffloadFields, Qwen2MoeConfig):
    model_type = "fivefold_qwen2_moe"

    router_z_loss_coef: float = 0.0

    def __post_init__(self, **kwargs) -> None:
        super().__post_init__(**kwargs)
        if not self.use_sliding_window:
            self.sliding_window = None  # stock writes 0 for "no layer slides"; its own config reads it back so

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_positive(self, "shared_expert_intermediate_size")
