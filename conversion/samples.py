"""Tiny stock checkpoints for `fivefold demo`, `fivefold verify`, the docs and the tests."""

import os
from pathlib import Path

import torch
import transformers

from fivefold.architectures import architecture_for_model_type


def build_stock_checkpoint(
    stock_model_type: str, stock_class: str, folder: str | os.PathLike, seed: int = 0, **config_overrides
) -> Path:
    """Random-initialises a stock model (fixed seed) from the tiny config and saves it with `save_pretrained`,
    i.e. exactly the public layout. Noise is added on top of the stock init so that every part (attention
    pattern, norms, biases) visibly shapes the output."""
    arch = architecture_for_model_type(stock_model_type)
    config = transformers.AutoConfig.for_model(stock_model_type, **{**arch.tiny, **config_overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, stock_class)(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(folder)
    return Path(folder)
