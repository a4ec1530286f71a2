"""Checks of the tensors users pass in (token ids, input embeddings): a wrong dtype, rank or width is named here
rather than failing deep inside an embedding lookup or a matmul."""

import torch


def check_token_tensor(ids: object, name: str, dims: tuple[int, ...] = (2,)) -> None:
    """Token ids (`input_ids`, `decoder_input_ids`, `token_type_ids`) must be an integer tensor of `dims`
    dimensions: a float, bool or list input, or a batch without its batch dimension, is named here rather than
    failing deep inside an embedding lookup."""
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"{name} must be a torch tensor of token ids, got a {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.dim() not in dims:
        wanted = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"{name} must be {wanted} ([batch, seq_len]), got shape {list(ids.shape)}")


def check_embeds_tensor(embeds: object, width: int, name: str = "inputs_embeds") -> None:
    """`inputs_embeds` must be a floating [batch, seq_len, width] tensor of the model's width."""
    if not isinstance(embeds, torch.Tensor) or not embeds.dtype.is_floating_point or embeds.dim() != 3:
        is_tensor = isinstance(embeds, torch.Tensor)
        shown = f"shape {list(embeds.shape)}, dtype {embeds.dtype}" if is_tensor else f"a {type(embeds).__name__}"
        raise ValueError(f"{name} must be a floating-point [batch, seq_len, {width}] tensor, got {shown}")
    if embeds.shape[-1] != width:
        raise ValueError(f"{name} has width {embeds.shape[-1]}; the model's hidden size is {width}")
