"""Qwen3-MoE under the `fivefold_qwen3_moe` model type: every field of the stock `Qwen3MoeConfig` is accepted as
is (`head_dim` too, as stock reads it), plus `router_z_loss_coef` (ST-MoE's router z-loss, off by default)."""

from huggingface_hub.dataclasses import strict
from transformers import Qwen3MoeConfig

from .moe import MoEConfigMixin
from .offload import ExpertOffloadFields


@strict(accept_kwargs=True)
class FivefoldQwen3MoeConfig(MoEConfigMixin, ExpertOffloadFields, Qwen3MoeConfig):
    model_type = "fivefold_qwen3_moe"

    router_z_loss_coef: float = 0.0
