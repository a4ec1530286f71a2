"""ModernBERT under the `fivefold_modernbert` model type.

Every field of the stock `ModernBertConfig` is accepted as is, in both forms found on the Hub: the public
checkpoints' `global_attn_every_n_layers`, `global_rope_theta` and `local_rope_theta` (turned by the stock config
into `layer_types` and `rope_parameters`), and the v5 `layer_types` / `rope_parameters`.
"""

from huggingface_hub.dataclasses import strict
from transformers import ModernBertConfig

from .base import FivefoldConfigMixin
from .parallel import tensor_parallel_plan
from .validation import check_attention_heads, check_positive

LAYER_TYPES = ("full_attention", "sliding_attention")


@strict(accept_kwargs=True)
class FivefoldModernBertConfig(FivefoldConfigMixin, ModernBertConfig):
    model_type = "fivefold_modernbert"
    base_model_tp_plan = tensor_parallel_plan("")
    # Run padded batches on their real tokens only (fivefold.modeling.padding); False: the padded layout throughout.
    unpad_inputs: bool = True

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_positive(self, "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "local_attention")
        check_attention_heads(self)
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= set(LAYER_TYPES):
            raise ValueError(
                f"layer_types must list {self.num_hidden_layers} entries (num_hidden_layers) from {LAYER_TYPES}, "
                f"got {self.layer_types}"
            )
        for layer_type in set(self.layer_types):
            rope = (self.rope_parameters or {}).get(layer_type) or {}
            if rope.get("rope_type", "default") != "default":
                raise ValueError(
                    f"rope_parameters[{layer_type!r}]: only rope_type 'default' is supported, got {rope['rope_type']!r}"
                )
        if self.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling must be 'cls' or 'mean', got {self.classifier_pooling!r}")
