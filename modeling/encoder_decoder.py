"""The encoder-decoder: the shared stack twice (bidirectional, and causal with cross-attention to the first),
and the models around them (bare, conditional generation with `generate()`, encoder only).

Positions are a relative bias per stack, folded with the padding (and causal) mask into one additive float mask
that every layer's kernel adds to its scores (kernels.relative_bias_mask). An architecture supplies
`recipe(config) -> EncoderDecoderRecipe` and a one-line `stack_class`.

Shapes: B batch, T time (the decoder's), P cached steps, S key positions (the encoder's time), C channels,
H query heads, V vocabulary.

The decoder's own keys are its P + T positions, or every slot of a static cache.
"""

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.utils import DUMMY_INPUTS, DUMMY_MASK
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .attention import Attention, CrossAttention
from .batching import ContinuousBatching
from .block import Block
from .embeddings import Embedding
from .heads import HeadSpec
from .kernels import cross_mask, relative_bias_mask
from .losses import check_labels, cross_entropy, tokens_shape
from .pretrained import FivefoldPreTrainedModel
from .stack import Stack, StackSpec
from .tasks import TaskModel
from .tracing import clears_stale_capture

accepts_past_key_values = deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")


@dataclass(frozen=True)
class EncoderDecoderRecipe:
    encoder: StackSpec
    decoder: StackSpec  # its blocks have cross-attention
    heads: Mapping[str, HeadSpec] = field(default_factory=dict)
    logits_scale: float = 1.0  # on the decoder output before the LM head (T5 v1.0: d_model^-0.5)


def shift_right(labels: torch.Tensor, start_token_id: int | None, pad_token_id: int | None) -> torch.Tensor:
    """[B, T] labels -> decoder inputs: the start token, then the labels but the last, -100 read as padding."""
    if start_token_id is None or pad_token_id is None:
        raise ValueError("config.decoder_start_token_id and config.pad_token_id are needed to build decoder inputs")
    shifted = labels.new_full(labels.shape, start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == -100, pad_token_id)


class EncoderDecoderPreTrainedModel(FivefoldPreTrainedModel):
    base_model_prefix = ""  # the public layout has no prefix: `shared`, `encoder.*`, `decoder.*`, `lm_head`
    # The relative bias rides in an additive float mask, which flash and flex kernels do not take.
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False
    _can_record_outputs = {
        "hidden_states": Block,
        "attentions": OutputRecorder(Attention, index=1, layer_name="attn"),
        "cross_attentions": OutputRecorder(CrossAttention, index=1),
    }

    @staticmethod
    def recipe(config) -> EncoderDecoderRecipe:
        raise NotImplementedError("an encoder-decoder architecture defines recipe(config)")

    @property
    def dummy_inputs(self) -> dict[str, torch.Tensor]:
        """Inputs a forward takes, the decoder's included, as stock's T5 gives them (tracing tools read them)."""
        ids = torch.tensor(DUMMY_INPUTS)
        return {"decoder_input_ids": ids, "input_ids": ids, "decoder_attention_mask": torch.tensor(DUMMY_MASK)}


def fields_unless_asked(forward: Callable) -> Callable:
    """A stack's output as fields unless its caller passes `return_dict=False`: stock's stacks hold copies of the
    model's config, so a user's `model.config.return_dict = False` does not reach `model.get_encoder()(...)`, and
    fivefold's share the model's config."""

    @functools.wraps(forward)
    def run(self, *args, **kwargs):
        kwargs.setdefault("return_dict", True)
        return forward(self, *args, **kwargs)

    return run


class EncoderDecoderStack(EncoderDecoderPreTrainedModel, Stack):
    """embed -> blocks (relative bias in the mask; the decoder's cross-attend) -> final norm -> dropout."""

    def __init__(self, config, spec: StackSpec):
        super().__init__(config, spec)
        self.causal = spec.blocks[0].attention.is_causal  # the decoder: causal, cached, cross-attends the encoder
        self.post_init()

    @clears_stale_capture
    @fields_unless_asked
    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, P + T]: past and present tokens, 1 = token, 0 = padding
        inputs_embeds: torch.Tensor | None = None,  # [B, T, C]
        encoder_hidden_states: torch.Tensor | None = None,  # [B, S, C]
        encoder_attention_mask: torch.Tensor | None = None,  # [B, S]
        cache: EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        self.embeddings.check_inputs(input_ids, inputs_embeds, "decoder_input_ids" if self.causal else "input_ids")
        hidden = self.embeddings(input_ids, inputs_embeds=inputs_embeds)  # [B, T, C], after dropout
        t = hidden.shape[1]
        use_cache = self.causal and (use_cache if use_cache is not None else self.config.use_cache)
        if self.training and self.checkpointing():
            use_cache = False
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        cache = cache if use_cache else None
        self_cache = cache.self_attention_cache if cache is not None else None
        past = self_cache.get_seq_length() if self_cache is not None else 0  # a 0-d tensor for a static cache
        static = self_cache is not None and self_cache.is_compileable
        keys = self_cache.get_max_length() if static else past + t  # a static cache's keys: all its slots

        bias = self.relative_bias(t, keys, past, hidden.device).to(hidden.dtype)  # [1, H, T, S]
        mask = relative_bias_mask(bias, attention_mask, self.causal, past, static)  # [B or 1, H, T, S]
        cross = ()
        if encoder_hidden_states is not None:
            enc_mask = cross_mask(encoder_attention_mask, encoder_hidden_states.shape[1], hidden.dtype)  # [B, 1, 1, S]
            cross = (encoder_hidden_states, enc_mask, cache)
        hidden = self.run_blocks(hidden, [mask] * len(self.layers), cross=cross, cache=self_cache, **kwargs)
        hidden = self.dropout(self.norm(hidden))
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden, cache=cache)


class EncoderDecoderBase(EncoderDecoderPreTrainedModel, TaskModel):
    """Shared embeddings and the stacks; each stack's word embeddings are tied to `shared`."""

    stack_class: type[EncoderDecoderStack]
    stacks: tuple[str, ...] = ("encoder", "decoder")
    input_embeddings_key = "shared.weight"

    def __init__(self, config):
        super().__init__(config)
        recipe = self.recipe(config)
        self._tied_weights_keys = {f"{s}.embeddings.word_embeddings.weight": "shared.weight" for s in self.stacks}
        self.shared = Embedding(config.vocab_size, config.hidden_size)
        for name in self.stacks:
            self.add_module(name, self.stack_class(config, getattr(recipe, name)))
        self.add_heads(config, recipe.heads, config.hidden_size)
        self.logits_scale = recipe.logits_scale
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        for name in self.stacks:
            getattr(self, name).set_input_embeddings(value)

    def run(
        self,
        *,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        decoder_input_ids: torch.Tensor | None,
        decoder_attention_mask: torch.Tensor | None,
        encoder_outputs: BaseModelOutput | tuple | None,
        cache: EncoderDecoderCache | None,
        inputs_embeds: torch.Tensor | None,
        decoder_inputs_embeds: torch.Tensor | None,
        use_cache: bool | None,
        **kwargs,
    ) -> tuple[BaseModelOutput, BaseModelOutputWithPastAndCrossAttentions]:
        kwargs.pop("return_dict", None)  # the stacks answer with fields (fields_unless_asked)
        # Both stacks' inputs are checked before the encoder runs: a bad decoder input costs no encoder pass.
        if encoder_outputs is None:
            self.encoder.embeddings.check_inputs(input_ids, inputs_embeds)
        self.decoder.embeddings.check_inputs(decoder_input_ids, decoder_inputs_embeds, "decoder_input_ids")
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif isinstance(encoder_outputs, (tuple, list)):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            inputs_embeds=decoder_inputs_embeds,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            **kwargs,
        )
        return encoder_outputs, decoder_outputs


def _seq2seq_fields(encoder_outputs, decoder_outputs) -> dict:
    return dict(
        cache=decoder_outputs.cache,
        decoder_hidden_states=decoder_outputs.hidden_states,
        decoder_attentions=decoder_outputs.attentions,
        cross_attentions=decoder_outputs.cross_attentions,
        encoder_last_hidden_state=encoder_outputs.last_hidden_state,
        encoder_hidden_states=encoder_outputs.hidden_states,
        encoder_attentions=encoder_outputs.attentions,
    )


class EncoderDecoderModel(EncoderDecoderBase):
    @accepts_past_key_values
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, S]
        attention_mask: torch.Tensor | None = None,  # [B, S]
        decoder_input_ids: torch.Tensor | None = None,  # [B, T]
        decoder_attention_mask: torch.Tensor | None = None,  # [B, P + T]
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        enc, dec = self.run(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(last_hidden_state=dec.last_hidden_state, **_seq2seq_fields(enc, dec))


class EncoderDecoderForConditionalGeneration(EncoderDecoderBase, ContinuousBatching, GenerationMixin):
    """The LM head on the decoder; the loss is cross-entropy on unshifted labels (decoder inputs are the labels
    shifted right from `decoder_start_token_id`)."""

    tasks = {"seq2seq_lm": "vocab_size"}
    output_task = "seq2seq_lm"
    # Stock T5 fails there too (its requests end with an error); the manager has no encoder inputs to give.
    continuous_batching_refusal = "the continuous-batching manager feeds decoder-only rows, with no encoder inputs"

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_right(labels, self.config.decoder_start_token_id, self.config.pad_token_id)

    @accepts_past_key_values
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, S]
        attention_mask: torch.Tensor | None = None,  # [B, S]
        decoder_input_ids: torch.Tensor | None = None,  # [B, T]
        decoder_attention_mask: torch.Tensor | None = None,  # [B, P + T]
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B, T], -100 = not predicted
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, (*(tokens_shape(input_ids, inputs_embeds)[:1] or (None,)), None))
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        enc, dec = self.run(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden = dec.last_hidden_state
        if self.logits_scale != 1.0:
            hidden = hidden * self.logits_scale
        logits = self.run_head("seq2seq_lm", hidden)  # [B, T, V]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return Seq2SeqLMOutput(loss=loss, logits=logits, **_seq2seq_fields(enc, dec))


class EncoderOnlyModel(EncoderDecoderBase):
    """The encoder stack alone (`AutoModelForTextEncoding`): embeddings for retrieval or a text-to-image model."""

    stacks = ("encoder",)
    _keys_to_ignore_on_load_unexpected = [r"^decoder\."]

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, S]
        attention_mask: torch.Tensor | None = None,  # [B, S]
        inputs_embeds: torch.Tensor | None = None,  # [B, S, C]
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        kwargs.pop("return_dict", None)  # the stacks answer with fields (fields_unless_asked)
        # The encoder stack's own output, as stock returns it: its cross-attentions an empty tuple when asked for.
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs)
