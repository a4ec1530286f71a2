"""Unpadded execution: a padded batch packed into its real tokens, and attention that stays inside each sequence.

An encoder packs once after reading its inputs, runs every layer on the packed tokens, and pads once at the output.
Attention receives a `PackedSequences` in place of a mask and runs `kernels.packed_attention`. Documents that come
already packed in one row (position ids restarting per document, no mask) take the same path without the packing.

Shapes: B batch, T time (padded), N tokens (the real ones, packed), C channels, H query heads,
K key/value heads, D head dim.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import pairwise

import torch
import torch.nn.functional as F


def document_starts(positions: torch.Tensor) -> torch.Tensor:
    """[N] position ids -> [N] bool, True where a document starts (the first token, and every restart)."""
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] != positions[:-1] + 1
    return starts


def is_packed_row(position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None) -> bool:
    """Whether the inputs are documents packed end to end in one row, as `DataCollatorWithFlattening` writes them:
    one [1, N] row, no attention mask, and position ids that restart (transformers reads packing the same way).
    A one-token row (a decoding step) holds one document: answered from its shape, which a compiled step can read
    (the test of the ids is a data-dependent branch, a graph break)."""
    if position_ids is None or attention_mask is not None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return False
    if position_ids.shape[1] < 2:
        return False
    return bool(document_starts(position_ids[0])[1:].any())


def traced_documents(position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[N] each token's document (0, 1, ...) in a [1, N] row without a mask, for a traced graph, which cannot branch
    on whether the row is packed as `is_packed_row` does: a row of one document is all zeros. None otherwise."""
    if position_ids is None or attention_mask is not None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    return document_starts(position_ids[0]).cumsum(0) - 1


def same_document(documents: torch.Tensor) -> Callable[[int, int, int, int], torch.Tensor]:
    """A transformers mask function (batch, head, query, key) -> allowed: a token sees its own document only."""

    def allowed(batch_idx, head_idx, q_idx, kv_idx):
        return documents[q_idx] == documents[kv_idx]

    return allowed


@dataclass(frozen=True, eq=False)
class PackedSequences:
    """Where the real tokens of a padded [B, T] batch sit, and how the packed batch splits into sequences."""

    indices: torch.Tensor  # [N], flat positions in B * T of the real tokens, row by row
    columns: torch.Tensor  # [N], each real token's position in its padded row
    cu_seqlens: torch.Tensor  # [S + 1] int32, sequence boundaries in the packed tokens (empty rows dropped)
    bounds: tuple[tuple[int, int], ...]  # the same boundaries as Python ints, for slicing
    max_seqlen: int
    batch: int
    length: int
    window: int | None = None  # sliding-window attention: keys within `window` padded positions of the query
    _blocks: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> "PackedSequences":
        """From a [B, T] padding mask (nonzero = token)."""
        keep = attention_mask.bool()
        batch, length = keep.shape
        indices = keep.flatten().nonzero().squeeze(1)
        lengths = keep.sum(1)
        lengths = lengths[lengths > 0]
        cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        edges = cu_seqlens.tolist()
        return cls(
            indices=indices,
            columns=indices % length,
            cu_seqlens=cu_seqlens,
            bounds=tuple(pairwise(edges)),
            max_seqlen=int(lengths.max()) if lengths.numel() else 0,
            batch=batch,
            length=length,
        )

    @classmethod
    def from_position_ids(cls, position_ids: torch.Tensor) -> "PackedSequences":
        """From one packed row's [1, N] position ids (transformers' `DataCollatorWithFlattening`): a document
        starts wherever a position does not follow the one before it."""
        positions = position_ids.reshape(-1)
        count = positions.numel()
        edges = [*document_starts(positions).nonzero().squeeze(1).tolist(), count]
        lengths = torch.tensor(edges).diff()
        every = torch.arange(count, device=positions.device)
        return cls(
            indices=every,
            columns=every,  # window masks read differences, the same within a document as its positions'
            cu_seqlens=torch.tensor(edges, dtype=torch.int32, device=positions.device),
            bounds=tuple(pairwise(edges)),
            max_seqlen=int(lengths.max()),
            batch=1,
            length=count,
        )

    @property
    def num_tokens(self) -> int:
        return self.indices.numel()

    def with_window(self, window: int | None) -> "PackedSequences":
        return self if window == self.window else replace(self, window=window, _blocks={})

    def unpad(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """[B, T, ...] (or [1, T, ...], broadcast over the batch) -> [1, N, ...]."""
        if x is None:
            return None
        x = x.expand(self.batch, *x.shape[1:])
        return x.reshape(self.batch * self.length, *x.shape[2:])[self.indices].unsqueeze(0)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[1, N, ...] -> [B, T, ...], zeros at padded positions (differentiable)."""
        flat = x.new_zeros(self.batch * self.length, *x.shape[2:])
        flat = flat.index_put((self.indices,), x[0])
        return flat.view(self.batch, self.length, *x.shape[2:])

    def attention_blocks(self, start: int, end: int) -> tuple[tuple[slice, slice, torch.Tensor | None], ...]:
        """One sequence's attention (packed tokens start..end) as blocks of queries, each over the keys its window
        can reach: (queries, keys, bool mask over them, None where it hides nothing). A sequence longer than four
        windows splits into blocks of `window` queries, each over the keys up to a window before and after it:
        the scores the band hides are then never computed (on CPU 40-45% less attention time for a 512-token
        sequence under ModernBERT's window). Keys further away by index are further away by position too: a row's
        positions grow with its tokens' index."""
        if (start, end) not in self._blocks:
            w, length = self.window, end - start
            step = w if w and length > 4 * w else length  # a window of 0 or None: one block
            blocks = []
            for q in range(start, end, step):
                queries = slice(q, min(q + step, end))
                keys = slice(start, end) if step == length else slice(max(start, q - w), min(end, q + step + w))
                blocks.append((queries, keys, self.band_mask(queries, keys)))
            self._blocks[(start, end)] = tuple(blocks)
        return self._blocks[(start, end)]

    def band_mask(self, queries: slice, keys: slice) -> torch.Tensor | None:
        """[Q, K] bool mask of these queries over these keys under the sliding window (None: no window, or it
        hides none of them)."""
        if self.window is None:
            return None
        band = (self.columns[queries, None] - self.columns[None, keys]).abs() <= self.window
        return None if bool(band.all()) else band
