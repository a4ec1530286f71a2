"""The bidirectional encoder stack: embeddings -> blocks -> final norm (-> pooler).

An architecture supplies `recipe(config) -> EncoderRecipe`; everything else here is shared.

Unpadded execution: when a batch has padding, the real tokens are packed once after the inputs are read
([B, T] -> [1, N]), every layer runs on them, attention stays within each sequence (padding.py), and the padded
layout comes back only at the output, with zeros at padded positions. `config.unpad_inputs = False` turns it off.
It applies with the sdpa and flash kernels; eager (the reference, and the one that returns attention weights) and
flex run padded. Hidden states recorded with `output_hidden_states` are returned in the padded layout.

Shapes: B batch, T time, C channels.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers.masking_utils import create_bidirectional_mask, sliding_window_bidirectional_overlay
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.utils.generic import is_flash_attention_requested
from transformers.utils.output_capturing import _active_collector, capture_outputs

from .attention import Attention
from .block import Block, BlockSpec
from .embeddings import EmbeddingSpec, TokenEmbeddings
from .heads import Pooler
from .norms import build_norm
from .padding import PackedSequences
from .pretrained import FivefoldPreTrainedModel
from .rotary import RotaryEmbedding

# Kernels the packed path replaces; eager and flex keep the padded layout.
UNPADDED_KERNELS = ("sdpa",)


@dataclass(frozen=True)
class EncoderRecipe:
    embeddings: EmbeddingSpec
    blocks: tuple[BlockSpec, ...]
    final_norm: str  # "none" for post-norm stacks
    norm_eps: float
    lm_head_act: str  # activation inside the masked-LM head
    lm_head_norm: str
    sequence_classifier: str  # key in heads.SEQUENCE_CLASSIFIERS
    classifier_dropout: float  # before the sequence and token classifiers
    multiple_choice_dropout: float  # before the multiple-choice scorer
    # Per block, aligned with `blocks` (empty: every block attends globally / has no rotary positions).
    windows: tuple[int | None, ...] = ()  # a sliding window: keys within this many positions of the query
    rotary_thetas: tuple[float, ...] = ()  # the rotary base of each block's attention


def check_attention_mask(attention_mask: torch.Tensor | None, batch: int, length: int) -> None:
    """A [B, T] padding mask must match the inputs; a ready-made 4D mask is passed through as in stock."""
    if attention_mask is None or attention_mask.dim() == 4:
        return
    if tuple(attention_mask.shape) != (batch, length):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, expected (batch, seq_len) = {(batch, length)}"
        )


def pad_captured_hidden_states(packed: PackedSequences) -> None:
    """Hidden states recorded from the blocks (`output_hidden_states`) were packed: give them the padded layout."""
    collecting = _active_collector.get()
    if collecting is None or "hidden_states" not in collecting:
        return
    states = collecting["hidden_states"]
    states[:] = [None if state is None else packed.pad(state) for state in states]


class EncoderPreTrainedModel(FivefoldPreTrainedModel):
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["TokenEmbeddings", "Block"]
    _can_record_outputs = {"hidden_states": Block, "attentions": Attention}

    @staticmethod
    def recipe(config) -> EncoderRecipe:
        raise NotImplementedError("an encoder architecture defines recipe(config)")


class EncoderModel(EncoderPreTrainedModel):
    def __init__(self, config, add_pooling_layer: bool = True):
        super().__init__(config)
        recipe = self.recipe(config)
        self.embeddings = TokenEmbeddings(recipe.embeddings)
        self.layers = nn.ModuleList(Block(config, spec, i) for i, spec in enumerate(recipe.blocks))
        self.norm = build_norm(recipe.final_norm, config.hidden_size, recipe.norm_eps)
        self.pooler = Pooler(config.hidden_size) if add_pooling_layer else None
        self.windows = recipe.windows or (None,) * len(recipe.blocks)
        # One rotary table per distinct base; each block reads the one of its own base.
        thetas = sorted(set(recipe.rotary_thetas))
        self.rotary = nn.ModuleList(RotaryEmbedding(self.layers[0].attn.head_dim, theta) for theta in thetas)
        self.rotary_of_block = [thetas.index(theta) for theta in recipe.rotary_thetas]
        self.post_init()

    def unpads(self, attention_mask: torch.Tensor | None) -> bool:
        """Whether this call runs on packed tokens: a [B, T] mask with padding, and a kernel that benefits (sdpa,
        flash: neither returns attention weights; eager, which does, keeps the padded layout)."""
        if not getattr(self.config, "unpad_inputs", True) or attention_mask is None or attention_mask.dim() != 2:
            return False
        implementation = self.config._attn_implementation
        if implementation not in UNPADDED_KERNELS and not is_flash_attention_requested(
            requested_attention_implementation=implementation
        ):
            return False
        real = int(attention_mask.bool().sum())
        return 0 < real < attention_mask.numel()

    def attention_masks(self, hidden: torch.Tensor, attention_mask, packed: PackedSequences | None) -> list:
        """One mask per block, built once per distinct window (a PackedSequences when unpadded)."""
        masks = {}
        for window in set(self.windows):
            if packed is not None:
                masks[window] = packed.with_window(window)
                continue
            overlay = None if window is None else sliding_window_bidirectional_overlay(window)
            masks[window] = create_bidirectional_mask(
                config=self.config, inputs_embeds=hidden, attention_mask=attention_mask, and_mask_function=overlay
            )
        return [masks[window] for window in self.windows]

    def layer_kwargs(self, index: int, packed: PackedSequences | None) -> dict:
        """Flash kernels take a block's sliding window as an argument rather than from the mask."""
        window = self.windows[index]
        if window is None or packed is not None or not is_flash_attention_requested(config=self.config):
            return {}
        return {"sliding_window": window + 1}  # transformers' flash kernels count w as w - 1 positions each side

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, T], 1 = token, 0 = padding
        token_type_ids: torch.Tensor | None = None,  # [B, T]
        position_ids: torch.Tensor | None = None,  # [B, T]
        inputs_embeds: torch.Tensor | None = None,  # [B, T, C]
        **kwargs,
    ) -> BaseModelOutputWithPoolingAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        device = (input_ids if input_ids is not None else inputs_embeds).device
        check_attention_mask(attention_mask, batch, length)
        if position_ids is None:
            position_ids = self.embeddings.position_ids(input_ids, batch, length, device)  # [B, T]

        packed = PackedSequences.from_mask(attention_mask) if self.unpads(attention_mask) else None
        if packed is not None:  # [B, T, ...] -> [1, N, ...] from here to the output
            input_ids, token_type_ids, position_ids, inputs_embeds = (
                packed.unpad(x) for x in (input_ids, token_type_ids, position_ids, inputs_embeds)
            )
        hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # [B, T, C] or [1, N, C]
        masks = self.attention_masks(hidden, attention_mask, packed)
        tables = [rotary(position_ids, hidden.dtype) for rotary in self.rotary]
        for i, layer in enumerate(self.layers):
            positions = tables[self.rotary_of_block[i]] if self.rotary_of_block else None
            hidden = layer(hidden, masks[i], positions, **self.layer_kwargs(i, packed), **kwargs)
        hidden = self.norm(hidden)
        if packed is not None:
            hidden = packed.pad(hidden)
            pad_captured_hidden_states(packed)
        pooled = self.pooler(hidden) if self.pooler is not None else None  # [B, C]
        return BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=hidden, pooler_output=pooled)
