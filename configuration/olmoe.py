"""OLMoE under the `fivefold_olmoe` model type: every field of the stock `OlmoeConfig` is accepted as is, plus
`router_z_loss_coef` (ST-MoE's router z-loss, off by default). `clip_qkv` (clamped q/k/v projections), which no
public OLMoE checkpoint sets, is refused by name."""

from huggingface_hub.dataclasses import strict
from transformers import OlmoeConfig

from .moe import MoEConfigMixin
from .offload import ExpertOffloadFields
from .parallel import GATHERED_ATTENTION, tensor_parallel_plan


@strict(accept_kwargs=True)
class FivefoldOlmoeConfig(MoEConfigMixin, ExpertOffloadFields, OlmoeConfig):
    model_type = "fivefold_olmoe"
    # Its q/k RMSNorm spans the whole projection, which no rank holds a shard of.
    base_model_tp_plan = tensor_parallel_plan("", experts=True, attention=GATHERED_ATTENTION)
    expert_size_field = "intermediate_size"  # OLMoE has no dense layers: its intermediate_size is the experts'

    router_z_loss_coef: float = 0.0

    def validate_architecture(self) -> None:
        super().validate_architecture()
        if self.clip_qkv is not None:
            raise ValueError(f"clip_qkv ({self.clip_qkv}) is not supported by fivefold_olmoe: it must be None")
