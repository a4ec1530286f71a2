"""ViT under the `fivefold_vit` model type: every field of the stock `ViTConfig` is accepted as is."""

from huggingface_hub.dataclasses import strict
from transformers import ViTConfig

from .base import FivefoldConfigMixin
from .parallel import tensor_parallel_plan
from .validation import check_vision_encoder


@strict(accept_kwargs=True)
class FivefoldViTConfig(FivefoldConfigMixin, ViTConfig):
    model_type = "fivefold_vit"
    base_model_tp_plan = tensor_parallel_plan("")

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_vision_encoder(self)
