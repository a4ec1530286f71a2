"""The bidirectional encoder: the shared stack over text (BERT, RoBERTa, ModernBERT) or image patches (ViT).

An architecture supplies `recipe(config) -> Recipe` (its stack and its task heads); everything else is shared,
the task models included (encoder_tasks.py).

Unpadded execution: when a text batch has padding, the real tokens are packed once after the inputs are read
([B, T] -> [1, N]), every layer runs on them, attention stays within each sequence (padding.py), and the padded
layout comes back only at the output, with zeros at padded positions. `config.unpad_inputs = False` turns it off;
kernels.unpads says when it applies; traced graphs stay padded and zero the padding (tracing.py). Hidden states
recorded with `output_hidden_states` come back padded too. Documents already packed in one row (transformers'
`DataCollatorWithFlattening`: [1, N] with position ids that restart per document, no mask) run on the same path,
each attending within itself.

Shapes: B batch, T time, N tokens (the real ones, packed), C channels, Ch image channels, Hi image height,
Wi image width.
"""

from collections.abc import Callable

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling, BaseModelOutputWithPoolingAndCrossAttentions
from transformers.utils.output_capturing import _active_collector, capture_outputs

from .kernels import bidirectional_masks, check_attention_mask, unpadding_allowed, unpads
from .padding import PackedSequences, is_packed_row, traced_documents
from .pretrained import FivefoldPreTrainedModel
from .stack import Recipe, Stack
from .tracing import clears_stale_capture, tracing


def map_captured_hidden_states(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Applies `fn` to the hidden states recorded from the blocks (`output_hidden_states`)."""
    collecting = _active_collector.get()
    if collecting is None or "hidden_states" not in collecting:
        return
    states = collecting["hidden_states"]
    states[:] = [None if state is None else fn(state) for state in states]


def zero_padding(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T, C] with zeros where the [B, T] mask is 0: the padded layout the packed path returns."""
    return hidden * attention_mask.bool()[..., None].to(hidden.dtype)


class EncoderPreTrainedModel(FivefoldPreTrainedModel):
    @staticmethod
    def recipe(config) -> Recipe:
        raise NotImplementedError("an encoder architecture defines recipe(config)")


class EncoderStack(EncoderPreTrainedModel, Stack):
    def __init__(self, config, add_pooling_layer: bool | None = None):
        super().__init__(config, self.recipe(config).stack, add_pooling_layer)
        self.post_init()

    def encode(
        self,
        hidden: torch.Tensor,  # [B, T, C] or [1, N, C]
        attention_mask: torch.Tensor | None,  # [B, T]
        position_ids: torch.Tensor | None,  # [B, T] or [1, N]
        packed: PackedSequences | None,
        documents: torch.Tensor | None = None,  # [N], a traced row's documents (padding.traced_documents)
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # [B, T, C], pooled [B, C] or None
        masks = bidirectional_masks(self.config, hidden, attention_mask, self.windows, packed, documents)
        hidden = self.dropout(self.norm(self.run_blocks(hidden, masks, position_ids, **kwargs)))
        if packed is not None:
            hidden = packed.pad(hidden)
            map_captured_hidden_states(packed.pad)
        elif tracing() and unpadding_allowed(self.config, attention_mask):
            # A traced graph runs padded (tracing.py); it returns what the packed path would, zeros at padding.
            hidden = zero_padding(hidden, attention_mask)
            map_captured_hidden_states(lambda state: zero_padding(state, attention_mask))
        return hidden, self.pooler(hidden) if self.pooler is not None else None


class EncoderModel(EncoderStack):
    """Text: input_ids (or embeddings) -> token embeddings -> the stack."""

    output_class = BaseModelOutputWithPoolingAndCrossAttentions  # stock's, per architecture

    @clears_stale_capture
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
        self.embeddings.check_inputs(input_ids, inputs_embeds)
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        device = (input_ids if input_ids is not None else inputs_embeds).device
        check_attention_mask(attention_mask, batch, length)
        # Documents packed in one row ([1, N], positions restarting per document) run as they come; a traced graph,
        # which cannot branch on the ids, keeps each document to itself in the mask instead.
        # (torch.jit.trace, whose mask building cannot take a mask function, keeps the eager test.)
        compiling = torch.compiler.is_compiling()
        documents = traced_documents(position_ids, attention_mask) if compiling else None
        packed = (
            PackedSequences.from_position_ids(position_ids)
            if not compiling and is_packed_row(position_ids, attention_mask)
            else None
        )
        if position_ids is None:
            position_ids = self.embeddings.position_ids(input_ids, batch, length, device)  # [B, T]
        if packed is None and unpads(self.config, attention_mask):  # [B, T, ...] -> [1, N, ...] up to the output
            packed = PackedSequences.from_mask(attention_mask)
            if input_ids is not None:  # looked up padded: a hook on the table (NEFTune's noise, sized by the
                # output's shape; PEFT's) sees stock's [B, T, C] and draws what it draws there
                input_ids, inputs_embeds = None, self.embeddings.word_embeddings(input_ids)  # [B, T, C]
            input_ids, token_type_ids, position_ids, inputs_embeds = (
                packed.unpad(x) for x in (input_ids, token_type_ids, position_ids, inputs_embeds)
            )
        hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # [B, T, C] or [1, N, C]
        hidden, pooled = self.encode(hidden, attention_mask, position_ids, packed, documents, **kwargs)
        if "pooler_output" not in self.output_class.__dataclass_fields__:  # no pooler: ModernBERT's BaseModelOutput
            return self.output_class(last_hidden_state=hidden)
        return self.output_class(last_hidden_state=hidden, pooler_output=pooled)


class ImageEncoderModel(EncoderStack):
    """Images: pixel_values -> patch embeddings ([CLS] and one token per patch) -> the stack."""

    def get_input_embeddings(self) -> torch.nn.Conv2d:
        return self.embeddings.patch_proj

    # hidden_states[-1] is the last block's output before the final norm, as in stock ViT.
    @clears_stale_capture
    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,  # [B, Ch, Hi, Wi]
        interpolate_pos_encoding: bool | None = None,  # True: accept image sizes other than config.image_size
        attention_mask: torch.Tensor | None = None,  # [B, T], 1 = attend (rarely used: every patch is real)
        **kwargs,
    ) -> BaseModelOutputWithPooling:
        if kwargs.pop("bool_masked_pos", None) is not None:  # stock's masked-image modelling, never silently ignored
            raise ValueError(
                "bool_masked_pos needs a mask token, which fivefold's ViT does not have (no ForMaskedImageModeling)"
            )
        hidden = self.embeddings(pixel_values, bool(interpolate_pos_encoding))  # [B, T, C]
        check_attention_mask(attention_mask, hidden.shape[0], hidden.shape[1])
        hidden, pooled = self.encode(hidden, attention_mask, None, None, **kwargs)
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=pooled)
