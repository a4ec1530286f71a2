"""Mistral under the `fivefold_mistral` model type: every field of the stock `MistralConfig` is accepted as is."""

from huggingface_hub.dataclasses import strict
from transformers import MistralConfig

from .llama_like import LlamaLikeConfigMixin


@strict(accept_kwargs=True)
class FivefoldMistralConfig(LlamaLikeConfigMixin, MistralConfig):
    model_type = "fivefold_mistral"
