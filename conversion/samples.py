"""Tiny stock checkpoints and sample inputs, for `fivefold demo`, `fivefold verify` and the tests."""

import os
from pathlib import Path

import torch
import transformers


def build_stock_checkpoint(
    stock_model_type: str, stock_class: str, folder: str | os.PathLike, seed: int = 0, **config_overrides
) -> Path:
    """Random-initialises a stock model (fixed seed) from the tiny config and saves it with `save_pretrained`,
    i.e. exactly the public layout. Noise is added on top of the stock init so that every part (attention
    pattern, norms, biases) visibly shapes the output."""
    from fivefold.architectures import architecture_for_model_type

    arch = architecture_for_model_type(stock_model_type)
    config = transformers.AutoConfig.for_model(stock_model_type, **{**arch.tiny, **config_overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, stock_class)(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(folder)
    return Path(folder)


def text_inputs(config, batch: int = 3, length: int = 12, seed: int = 0, choices: int | None = None) -> dict:
    """A padded batch of unequal lengths (the first row full, the last shortest) with token types.
    With `choices`, every tensor gains a choices dimension: [B, N, T]."""
    gen = torch.Generator().manual_seed(seed)
    rows = batch * (choices or 1)
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    # Token ids above every special id, so that no real token is mistaken for padding.
    input_ids = torch.randint(max(pad, 3) + 1, config.vocab_size, (rows, length), generator=gen)
    lengths = torch.linspace(length, max(2, length // 3), rows).round().long()
    attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, pad)
    token_type_ids = (torch.arange(length)[None, :] >= (lengths[:, None] // 2)).long() * attention_mask
    if getattr(config, "type_vocab_size", 2) < 2:  # GPT-2 has no such field: token types index its word table
        token_type_ids = torch.zeros_like(token_type_ids)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
    if choices:
        inputs = {k: v.view(batch, choices, length) for k, v in inputs.items()}
    return inputs


def text_sample(config, stock_class: str, seed: int = 0) -> dict:
    """The inputs `verify` and `demo` feed a text encoder's head class (multiple choice gets two choices)."""
    return text_inputs(config, seed=seed, choices=2 if stock_class.endswith("ForMultipleChoice") else None)


def left_padded(inputs: dict) -> dict:
    """The same rows padded on the left, as batched prompts are for generation."""
    mask = inputs["attention_mask"]
    order = torch.argsort(mask, dim=-1, stable=True)  # padding (0) first, tokens keep their order
    return {k: torch.gather(v, -1, order) for k, v in inputs.items()}


def causal_text_sample(config, stock_class: str, seed: int = 0) -> dict:
    """The inputs `verify` and `demo` feed a decoder: a ragged batch, left-padded, without token types."""
    inputs = text_inputs(config, seed=seed)
    inputs.pop("token_type_ids")
    return left_padded(inputs)
