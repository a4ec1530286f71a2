"""BERT under the `fivefold_bert` model type: every field of the stock `BertConfig` is accepted as is."""

from huggingface_hub.dataclasses import strict
from transformers import BertConfig

from .base import FivefoldConfigMixin
from .parallel import tensor_parallel_plan
from .validation import check_text_encoder


@strict(accept_kwargs=True)
class FivefoldBertConfig(FivefoldConfigMixin, BertConfig):
    model_type = "fivefold_bert"
    base_model_tp_plan = tensor_parallel_plan("")
    # Run padded batches on their real tokens only (fivefold.modeling.padding); False: the padded layout throughout.
    unpad_inputs: bool = True

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_text_encoder(self)
