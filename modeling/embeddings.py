"""Token embeddings: word + token type + learned absolute position, then norm and dropout. Every text model's
embeddings are this part; a recipe leaves out the tables it has none of (None).

Shapes: B batch, T time, C channels.
"""

from dataclasses import dataclass

import torch
from torch import nn

from .input_checks import check_embeds_tensor, check_token_tensor
from .int8 import int8_embedding
from .norms import build_norm
from .tracing import eager_only


class Embedding(nn.Embedding):
    """A drop-in `nn.Embedding` (same parameter, name and checkpoint layout) that reads a quantizer's int8 table
    row by row where int8.py allows, instead of dequantizing all of it at every call.

    A quantizer's table answers in the dtype it was quantized from, which `model.to(torch.bfloat16)` (or a
    `dtype=` load of a saved quantized folder) leaves as it was: it answers here in the dtype the model was built
    in or last cast to (`answer_dtype`), as a plain table would."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.answer_dtype = self.weight.dtype

    def _apply(self, fn, recurse: bool = True):
        answer = getattr(self, "answer_dtype", self.weight.dtype)  # a table pickled before it had one
        probe = fn(torch.empty(0, dtype=answer))  # what the cast (`.to`, `.half()`, ...) does to a table
        if probe.dtype.is_floating_point:
            self.answer_dtype = probe.dtype
        return super()._apply(fn, recurse)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if type(self.weight) in (torch.Tensor, nn.Parameter):
            return super().forward(ids)
        # Plain ids only: a tracer's proxy takes nn.Embedding's path.
        looked_up = int8_embedding(ids, self.weight) if type(ids) is torch.Tensor else None
        answer = getattr(self, "answer_dtype", self.weight.dtype)  # a table pickled before it had one
        return (super().forward(ids) if looked_up is None else looked_up).to(answer)


@dataclass(frozen=True)
class EmbeddingSpec:
    vocab_size: int
    hidden_size: int
    padding_idx: int | None = None  # the word table's padding row (kept at zero, no gradient); None: none
    max_positions: int | None = None  # a learned absolute position table; None: positions live in attention
    type_vocab_size: int | None = None  # a token-type table; None: no token types
    token_types_from_words: bool = False  # token_type_ids index the word table, added last (GPT-2)
    positions_after_padding: bool = False  # positions count from padding_idx + 1, padding keeps it (RoBERTa)
    norm: str = "none"  # key in NORMS
    norm_eps: float = 1e-12
    dropout: float = 0.0


def sequential_position_ids(batch: int, length: int, start: int, device: torch.device) -> torch.Tensor:
    """[B, T] holding start, start + 1, ... for every row."""
    return torch.arange(start, start + length, device=device).expand(batch, length)


def padding_aware_position_ids(input_ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """[B, T]: real tokens count up from padding_idx + 1, pad tokens keep padding_idx (RoBERTa's scheme)."""
    is_token = input_ids.ne(padding_idx).int()
    return (torch.cumsum(is_token, dim=1) * is_token).long() + padding_idx


def check_not_empty(shape: tuple[int, ...], name: str) -> None:
    if 0 in shape:
        raise ValueError(f"{name} has shape {list(shape)}: at least one sequence of at least one token is needed")


@eager_only
def check_token_ids_in_vocabulary(input_ids: torch.Tensor, vocab_size: int, name: str = "input_ids") -> None:
    if input_ids.numel() and bool(((input_ids < 0) | (input_ids >= vocab_size)).any()):
        bad = input_ids[(input_ids < 0) | (input_ids >= vocab_size)]
        raise ValueError(f"{name} hold token ids outside the vocabulary [0, {vocab_size}): e.g. {bad[:5].tolist()}")


def check_token_ids(input_ids: torch.Tensor, vocab_size: int, name: str = "input_ids") -> None:
    check_not_empty(tuple(input_ids.shape), name)
    check_token_ids_in_vocabulary(input_ids, vocab_size, name)


@eager_only
def check_token_type_ids(token_type_ids: torch.Tensor, type_vocab_size: int) -> None:
    check_token_tensor(token_type_ids, "token_type_ids", dims=(1, 2))
    if token_type_ids.numel() and bool(((token_type_ids < 0) | (token_type_ids >= type_vocab_size)).any()):
        raise ValueError(f"token_type_ids must lie in [0, {type_vocab_size}) (type_vocab_size)")


@eager_only
def check_position_ids(position_ids: torch.Tensor, max_positions: int) -> None:
    check_token_tensor(position_ids, "position_ids", dims=(1, 2))
    if position_ids.numel() and bool((position_ids < 0).any()):
        raise ValueError(f"position_ids must be >= 0, got e.g. {position_ids[position_ids < 0][:5].tolist()}")
    if position_ids.numel() and bool((position_ids >= max_positions).any()):
        raise ValueError(
            f"sequence too long for the position table: positions up to {int(position_ids.max())} needed, "
            f"max_position_embeddings is {max_positions}"
        )


class TokenEmbeddings(nn.Module):
    def __init__(self, spec: EmbeddingSpec):
        super().__init__()
        self.spec = spec
        self.word_embeddings = Embedding(spec.vocab_size, spec.hidden_size, padding_idx=spec.padding_idx)
        position_padding = spec.padding_idx if spec.positions_after_padding else None
        self.position_embeddings = (
            nn.Embedding(spec.max_positions, spec.hidden_size, padding_idx=position_padding)
            if spec.max_positions is not None
            else None
        )
        self.token_type_embeddings = (
            nn.Embedding(spec.type_vocab_size, spec.hidden_size) if spec.type_vocab_size is not None else None
        )
        self.norm = build_norm(spec.norm, spec.hidden_size, spec.norm_eps)
        self.dropout = nn.Dropout(spec.dropout)

    def check_inputs(self, input_ids: object, inputs_embeds: object, ids_name: str = "input_ids") -> None:
        """What a stack checks before it reads its inputs' shapes: exactly one of the ids and the embeddings, each
        a tensor of the right kind, the ids within the vocabulary (the live table: resize_token_embeddings may
        have grown it). `ids_name` is the argument the user passed (`decoder_input_ids` in a decoder)."""
        embeds_name = ids_name.replace("input_ids", "inputs_embeds")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"pass exactly one of {ids_name} or {embeds_name}")
        if input_ids is not None:
            check_token_tensor(input_ids, ids_name)
            check_token_ids(input_ids, self.word_embeddings.num_embeddings, ids_name)
        else:
            check_embeds_tensor(inputs_embeds, self.spec.hidden_size, embeds_name)
            check_not_empty(tuple(inputs_embeds.shape[:-1]), embeds_name)

    def position_ids(self, input_ids: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
        """[B, T]: the positions of a sequence read from its start (RoBERTa's follow the padding)."""
        if not self.spec.positions_after_padding:
            return sequential_position_ids(batch, length, 0, device)
        if input_ids is not None:
            return padding_aware_position_ids(input_ids, self.spec.padding_idx)
        return sequential_position_ids(batch, length, self.spec.padding_idx + 1, device)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, T]
        token_type_ids: torch.Tensor | None = None,  # [B, T]
        position_ids: torch.Tensor | None = None,  # [B, T] or [1, T]
        inputs_embeds: torch.Tensor | None = None,  # [B, T, C]
    ) -> torch.Tensor:  # [B, T, C]
        # The stack has run check_inputs on what the user passed (before packing it).
        if input_ids is not None:
            inputs_embeds = self.word_embeddings(input_ids)
        batch, length, _ = inputs_embeds.shape
        hidden = inputs_embeds
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros((batch, length), dtype=torch.long, device=inputs_embeds.device)
            else:
                check_token_type_ids(token_type_ids, self.token_type_embeddings.num_embeddings)
            hidden = hidden + self.token_type_embeddings(token_type_ids)
        # A model without token types ignores them, as stock's does: a tokenizer's or a dataset's column of them is
        # no error (Trainer hands it over where the head names it; stock's heads take it into **kwargs).
        if self.position_embeddings is not None:
            if position_ids is None:
                position_ids = self.position_ids(input_ids, batch, length, inputs_embeds.device)
            check_position_ids(position_ids, self.position_embeddings.num_embeddings)
            hidden = hidden + self.position_embeddings(position_ids)
        if self.spec.token_types_from_words and token_type_ids is not None:
            check_token_tensor(token_type_ids, "token_type_ids", dims=(1, 2))
            check_token_ids(token_type_ids, self.word_embeddings.num_embeddings, "token_type_ids")
            hidden = hidden + self.word_embeddings(token_type_ids)
        return self.dropout(self.norm(hidden))
