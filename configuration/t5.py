"""T5 under the `fivefold_t5` model type: every field of the stock `T5Config` is accepted as is (v1.0 `relu`,
v1.1 / FLAN `gated-gelu`)."""

import copy

from huggingface_hub.dataclasses import strict
from transformers import T5Config

from .base import FivefoldConfigMixin
from .parallel import tensor_parallel_plan
from .validation import check_positive


@strict(accept_kwargs=True)
class FivefoldT5Config(FivefoldConfigMixin, T5Config):
    model_type = "fivefold_t5"
    # FSDP2 (`DistributedConfig(fsdp_size=N)`) shards each block on its own, as stock's default plan does `layers.*`.
    base_model_fsdp_plan = {"encoder.layers.*": "free_full_weight", "decoder.layers.*": "free_full_weight"}
    base_model_tp_plan = tensor_parallel_plan("encoder", "decoder", cross_attention=True, relative_bias=True)

    def validate_architecture(self) -> None:
        super().validate_architecture()
        check_positive(
            self, "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
            "relative_attention_num_buckets", "relative_attention_max_distance",
        )  # fmt: skip

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None):
        """For the decoder alone, the decoder's depth: `generate()` sizes its caches from this config (stock T5
        keeps the encoder's `num_layers` there and fails when the decoder is deeper)."""
        config = super().get_text_config(decoder=decoder, encoder=encoder)
        if decoder and not encoder:
            config = copy.deepcopy(config) if config is self else config
            config.num_layers = self.num_decoder_layers
        return config
