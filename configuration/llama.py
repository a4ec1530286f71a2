"""Llama under the `fivefold_llama` model type: every field of the stock `LlamaConfig` is accepted as is."""

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

from .llama_like import LlamaLikeConfigMixin


@strict(accept_kwargs=True)
class FivefoldLlamaConfig(LlamaLikeConfigMixin, LlamaConfig):
    model_type = "fivefold_llama"
