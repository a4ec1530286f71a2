"""Sample inputs for the tiny checkpoints: what `fivefold demo`, `fivefold verify` and the tests feed a model.

Shapes: B batch, M choices, T time, Ch image channels.
"""

import torch


def text_inputs(config, batch: int = 3, length: int = 12, seed: int = 0, choices: int | None = None) -> dict:
    """A padded batch of unequal lengths (the first row full, the last shortest) with token types.
    With `choices`, every tensor gains a choices dimension: [B, M, T]."""
    gen = torch.Generator().manual_seed(seed)
    rows = batch * (choices or 1)
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    # Token ids above every special id, so that no real token is mistaken for padding.
    input_ids = torch.randint(max(pad, 3) + 1, config.vocab_size, (rows, length), generator=gen)
    lengths = torch.linspace(length, max(2, length // 3), rows).round().long()
    attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, pad)
    token_type_ids = (torch.arange(length)[None, :] >= (lengths[:, None] // 2)).long() * attention_mask
    if getattr(config, "type_vocab_size", 0) < 2:  # none at all in ModernBERT; GPT-2's would index its word table
        token_type_ids = torch.zeros_like(token_type_ids)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
    if choices:
        inputs = {k: v.view(batch, choices, length) for k, v in inputs.items()}
    return inputs


def text_sample(config, stock_class: str, seed: int = 0) -> dict:
    """The inputs `verify` and `demo` feed a text encoder's head class (multiple choice gets two choices)."""
    return text_inputs(config, seed=seed, choices=2 if stock_class.endswith("ForMultipleChoice") else None)


def text_sample_without_token_types(config, stock_class: str, seed: int = 0) -> dict:
    """`text_sample` for models without token types (ModernBERT), whose stock forward takes none."""
    inputs = text_sample(config, stock_class, seed)
    inputs.pop("token_type_ids")
    return inputs


def image_inputs(config, batch: int = 3, size: tuple[int, int] | None = None, seed: int = 0) -> dict:
    """Random normalised images, [B, channels, height, width], at the config's image size unless `size` is given."""
    gen = torch.Generator().manual_seed(seed)
    image_size = config.image_size if isinstance(config.image_size, list | tuple) else [config.image_size] * 2
    height, width = size or image_size
    return {"pixel_values": torch.randn(batch, config.num_channels, height, width, generator=gen)}


def image_sample(config, stock_class: str, seed: int = 0) -> dict:
    """The inputs `verify` and `demo` feed an image model: a batch at its native size."""
    return image_inputs(config, seed=seed)


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
