"""The stack every model runs: embeddings -> blocks -> final norm (-> dropout, pooler).

One construction for every family: the blocks from the recipe's `BlockSpec`s, one rotary table per distinct
base among them, each block's sliding window, the final norm. The families differ only in the forward that
reads their inputs and builds their masks: encoder.py (text and images), decoder.py (with a cache) and
encoder_decoder.py (T5's two stacks).

Shapes: B batch, T time, C channels.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from .block import Block, BlockSpec
from .embeddings import EmbeddingSpec, TokenEmbeddings
from .heads import Head, HeadSpec
from .kernels import window_kwargs
from .norms import build_norm
from .patch_embeddings import PatchEmbeddings, PatchEmbeddingSpec
from .pretrained import FivefoldPreTrainedModel
from .relative_position import RelativeBiasSpec, RelativePositionBias
from .rotary import RotaryEmbedding

EMBEDDINGS = {EmbeddingSpec: TokenEmbeddings, PatchEmbeddingSpec: PatchEmbeddings}


@dataclass(frozen=True)
class StackSpec:
    embeddings: EmbeddingSpec | PatchEmbeddingSpec
    blocks: tuple[BlockSpec, ...]
    norm: str = "none"  # the final norm, after the last block (key in NORMS; "none" for post-norm stacks)
    norm_eps: float = 1e-12
    dropout: float = 0.0  # on the final output (T5's)
    relative_bias: RelativeBiasSpec | None = None  # T5: a learned bias per relative position, in every mask
    pooler: HeadSpec | None = None  # `pooler_output`: e.g. [CLS] -> dense -> tanh (BERT, ViT)


@dataclass(frozen=True)
class Recipe:
    """What an encoder or decoder architecture is made of: its stack, and a head for each task it has (keyed as
    the task models name them: "masked_lm", "sequence_classification", "causal_lm", ...)."""

    stack: StackSpec
    heads: Mapping[str, HeadSpec] = field(default_factory=dict)
    # Masked LM: logits only where a label is set, labels equal to this id skipped (ModernBERT's
    # `sparse_prediction`); None: logits for every token.
    sparse_prediction: int | None = None


class Stack(FivefoldPreTrainedModel):
    # The first of `layers` this process runs: a pipeline stage's own (modeling/pipeline.py), whose earlier layers
    # are identities that never write the cache, so the cache is read there.
    first_layer: int = 0

    def __init__(self, config, spec: StackSpec, add_pooling_layer: bool | None = None):
        super().__init__(config)
        if add_pooling_layer and spec.pooler is None:
            raise ValueError(f"{type(self).__name__} has no pooler: pass add_pooling_layer=False")
        width = spec.blocks[0].attention.hidden_size
        # In the order the earlier per-family stacks registered them: building a model draws its random init,
        # and device_map places its modules, in this order.
        self.embeddings = EMBEDDINGS[type(spec.embeddings)](spec.embeddings)
        self.relative_bias = RelativePositionBias(spec.relative_bias) if spec.relative_bias is not None else None
        # One (cos, sin) table per distinct (head width, base, rope type); each rotary block reads the one of its own.
        rotary = [(b.attention.per_head, b.attention.rotary_theta, b.attention.rope_type) for b in spec.blocks]
        tables = list(dict.fromkeys(r for r in rotary if r[1] is not None))
        self.rotary = nn.ModuleList(RotaryEmbedding(*table, config=config) for table in tables)
        self.rotary_of_block = [tables.index(r) if r[1] is not None else None for r in rotary]
        self.layers = nn.ModuleList(Block(config, block, i) for i, block in enumerate(spec.blocks))
        self.norm = build_norm(spec.norm, width, spec.norm_eps)
        self.dropout = nn.Dropout(spec.dropout)
        wants_pooler = spec.pooler is not None and add_pooling_layer is not False
        self.pooler = Head(spec.pooler, width) if wants_pooler else None
        self.windows = tuple(block.attention.window for block in spec.blocks)

    def checkpointing(self) -> bool:
        """Whether activation checkpointing is on (transformers' `is_activation_checkpointing` walks every module)."""
        return any(layer.gradient_checkpointing for layer in self.layers)

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def run_blocks(
        self,
        hidden: torch.Tensor,  # [B, T, C]
        masks: list,  # one per block
        rotary_ids: torch.Tensor | None = None,  # [B, T]: the position ids the rotary tables are read at
        cross: tuple = (),  # (encoder states, their mask, the cache) for blocks with cross-attention
        **kwargs,
    ) -> torch.Tensor:  # [B, T, C]
        # Cross-attention's inputs go positionally: reentrant gradient checkpointing follows only those.
        tables = [rotary(rotary_ids, hidden.dtype) for rotary in self.rotary]
        for layer, mask, table, window in zip(self.layers, masks, self.rotary_of_block, self.windows, strict=True):
            positions = tables[table] if table is not None else None
            hidden = layer(hidden, mask, positions, *cross, **window_kwargs(self.config, window, mask), **kwargs)
        return hidden
