"""Qwen2 under the `fivefold_qwen2` model type: every field of the stock `Qwen2Config` is accepted as is."""

from huggingface_hub.dataclasses import strict
from transformers import Qwen2Config

from .llama_like import LlamaLikeConfigMixin


@strict(accept_kwargs=True)
class FivefoldQwen2Config(LlamaLikeConfigMixin, Qwen2Config):
    model_type = "fivefold_qwen2"
