"""RoBERTa under the `fivefold_roberta` model type: every field of the stock `RobertaConfig` is accepted as is."""

from huggingface_hub.dataclasses import strict
from transformers import RobertaConfig

from .base import FivefoldConfigMixin
from .parallel import tensor_parallel_plan
from .validation import check_text_encoder


@strict(accept_kwargs=True)
class FivefoldRobertaConfig(FivefoldConfigMixin, RobertaConfig):
    model_type = "fivefold_roberta"
    base_model_tp_plan = tensor_parallel_plan("")
    # Run padded batches on their real tokens only (fivefold.modeling.padding); False: the padded layout throughout.
    unpad_inputs: bool = True

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_text_encoder(self)
        # RoBERTa numbers positions from pad_token_id + 1, so the table must reach past it.
        if self.pad_token_id is None or self.max_position_embeddings <= self.pad_token_id + 1:
            raise ValueError(
                f"max_position_embeddings ({self.max_position_embeddings}) must exceed pad_token_id + 1 "
                f"(pad_token_id={self.pad_token_id}): RoBERTa positions start after the padding index"
            )
