"""Qwen3 under the `fivefold_qwen3` model type: every field of the stock `Qwen3Config` is accepted as is."""

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config

from .llama_like import LlamaLikeConfigMixin


@strict(accept_kwargs=True)
class FivefoldQwen3Config(LlamaLikeConfigMixin, Qwen3Config):
    model_type = "fivefold_qwen3"
