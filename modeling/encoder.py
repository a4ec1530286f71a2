"""The bidirectional encoder stack: embeddings -> blocks -> final norm (-> pooler).

An architecture supplies `recipe(config) -> EncoderRecipe`; everything else here is shared.

Shapes: B batch, T time, C channels.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.utils.output_capturing import capture_outputs

from .attention import Attention
from .block import Block, BlockSpec
from .embeddings import EmbeddingSpec, TokenEmbeddings
from .heads import Pooler
from .norms import build_norm
from .pretrained import FivefoldPreTrainedModel


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


def check_attention_mask(attention_mask: torch.Tensor | None, batch: int, length: int) -> None:
    """A [B, T] padding mask must match the inputs; a ready-made 4D mask is passed through as in stock."""
    if attention_mask is None or attention_mask.dim() == 4:
        return
    if tuple(attention_mask.shape) != (batch, length):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, expected (batch, seq_len) = {(batch, length)}"
        )


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
        self.post_init()

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
        hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # [B, T, C]
        check_attention_mask(attention_mask, hidden.shape[0], hidden.shape[1])
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask)
        for layer in self.layers:
            hidden = layer(hidden, mask, **kwargs)
        hidden = self.norm(hidden)
        pooled = self.pooler(hidden) if self.pooler is not None else None  # [B, C]
        return BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=hidden, pooler_output=pooled)
