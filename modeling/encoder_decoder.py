"""The encoder-decoder: a bidirectional stack, a causal stack that reads it through cross-attention, and the
models around them (bare, conditional generation with `generate()`, encoder only).

Positions are a relative bias per stack, folded with the padding (and causal) mask into one additive float mask
that every layer's kernel adds to its scores. An architecture supplies `recipe(config) -> EncoderDecoderRecipe`
and a one-line `stack_class`.

Shapes: B batch, T (decoder) time, S key time, C channels, H heads, V vocabulary.
"""

from dataclasses import dataclass

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
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .attention import Attention, CrossAttention, causal_bool_mask
from .block import Block, BlockSpec
from .embeddings import check_token_ids
from .linear import Linear
from .losses import check_labels, cross_entropy, tokens_shape
from .norms import build_norm
from .pretrained import FivefoldPreTrainedModel
from .relative_position import RelativeBiasSpec, RelativePositionBias


@dataclass(frozen=True)
class StackSpec:
    blocks: tuple[BlockSpec, ...]
    relative_bias: RelativeBiasSpec
    causal: bool  # the decoder: causal self-attention, a cache, cross-attention in its blocks
    final_norm: str
    norm_eps: float
    dropout: float  # on the embeddings and on the final output


@dataclass(frozen=True)
class EncoderDecoderRecipe:
    encoder: StackSpec
    decoder: StackSpec
    logits_scale: float  # on the decoder output before the LM head (T5 v1.0: d_model^-0.5)


def padding_allowed(attention_mask: torch.Tensor | None, key_length: int, name: str) -> torch.Tensor | None:
    """[B, S] 1/0 mask -> bool [B, 1, 1, S] (True = attend), or None without one or without padding (so that the
    kernels add a [1, H, T, S] bias instead of reading a mask per row)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape[1] != key_length:
        raise ValueError(f"{name} has shape {tuple(attention_mask.shape)}, expected (batch, {key_length})")
    if bool(attention_mask.all()):
        return None
    return attention_mask[:, None, None, :].bool()


def additive_mask(bias: torch.Tensor | None, allowed: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """bias (or 0) where allowed, the dtype's minimum elsewhere: the float mask eager and sdpa add to scores."""
    if allowed is None:
        return bias
    if bias is None:
        bias = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, bias, torch.finfo(dtype).min)


def shift_right(labels: torch.Tensor, start_token_id: int | None, pad_token_id: int | None) -> torch.Tensor:
    """[B, T] labels -> decoder inputs: the start token, then the labels but the last, -100 read as padding."""
    if start_token_id is None or pad_token_id is None:
        raise ValueError("config.decoder_start_token_id and config.pad_token_id are needed to build decoder inputs")
    shifted = labels.new_full(labels.shape, start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == -100, pad_token_id)


class EncoderDecoderPreTrainedModel(FivefoldPreTrainedModel):
    base_model_prefix = ""  # the public layout has no prefix: `shared`, `encoder.*`, `decoder.*`, `lm_head`
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _no_split_modules = ["Block"]
    _can_record_outputs = {
        "hidden_states": Block,
        "attentions": OutputRecorder(Attention, index=1, layer_name="attn"),
        "cross_attentions": OutputRecorder(CrossAttention, index=1),
    }

    @staticmethod
    def recipe(config) -> EncoderDecoderRecipe:
        raise NotImplementedError("an encoder-decoder architecture defines recipe(config)")


class Stack(EncoderDecoderPreTrainedModel):
    """embed -> dropout -> blocks (relative bias in the mask) -> final norm -> dropout."""

    def __init__(self, config, spec: StackSpec):
        super().__init__(config)
        self.spec = spec
        self.embed_tokens = nn.Embedding(config.vocab_size, spec.blocks[0].attention.hidden_size)
        self.relative_bias = RelativePositionBias(spec.relative_bias)
        self.layers = nn.ModuleList(Block(config, block, i) for i, block in enumerate(spec.blocks))
        self.final_norm = build_norm(spec.final_norm, spec.blocks[0].attention.hidden_size, spec.norm_eps)
        self.dropout = nn.Dropout(spec.dropout)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, S]: past and present tokens, 1 = token, 0 = padding
        inputs_embeds: torch.Tensor | None = None,  # [B, T, C]
        encoder_hidden_states: torch.Tensor | None = None,  # [B, S_enc, C]
        encoder_attention_mask: torch.Tensor | None = None,  # [B, S_enc]
        cache: EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if input_ids is not None:
            check_token_ids(input_ids, self.embed_tokens.num_embeddings)
            inputs_embeds = self.embed_tokens(input_ids)
        t = inputs_embeds.shape[1]
        use_cache = self.spec.causal and (use_cache if use_cache is not None else self.config.use_cache)
        if self.training and self.is_activation_checkpointing:
            use_cache = False
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        cache = cache if use_cache else None
        past = cache.self_attention_cache.get_seq_length() if cache is not None else 0

        dtype, device = inputs_embeds.dtype, inputs_embeds.device
        bias = self.relative_bias(t, past + t, past).to(dtype)  # [1, H, T, S]
        allowed = padding_allowed(attention_mask, past + t, "attention_mask")  # [B, 1, 1, S]
        if self.spec.causal and t > 1:
            causal = causal_bool_mask(t, past + t, device)  # [1, 1, T, S]
            allowed = causal if allowed is None else allowed & causal
        mask = additive_mask(bias, allowed, dtype)  # [B or 1, H, T, S]
        cross_mask = None
        if encoder_hidden_states is not None:
            cross_allowed = padding_allowed(encoder_attention_mask, encoder_hidden_states.shape[1], "attention_mask")
            cross_mask = additive_mask(None, cross_allowed, dtype)  # [B, 1, 1, S_enc]

        hidden = self.dropout(inputs_embeds)
        self_cache = cache.self_attention_cache if cache is not None else None
        for layer in self.layers:
            # Tensors that need gradients go positionally: reentrant gradient checkpointing only follows those.
            hidden = layer(hidden, mask, None, encoder_hidden_states, cross_mask, cache, cache=self_cache, **kwargs)
        hidden = self.dropout(self.final_norm(hidden))
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden, cache=cache)


class EncoderDecoderBase(EncoderDecoderPreTrainedModel):
    """Shared embeddings and the two stacks; each stack's `embed_tokens` is tied to `shared`."""

    stack_class: type[Stack]
    _tied_weights_keys = {f"{stack}.embed_tokens.weight": "shared.weight" for stack in ("encoder", "decoder")}
    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]

    def __init__(self, config):
        super().__init__(config)
        recipe = self.recipe(config)
        self.shared = nn.Embedding(config.vocab_size, config.hidden_size)
        self.encoder = self.stack_class(config, recipe.encoder)
        self.decoder = self.stack_class(config, recipe.decoder)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.encoder.set_input_embeddings(value)
        self.decoder.set_input_embeddings(value)

    def _run(
        self,
        input_ids,
        attention_mask,
        decoder_input_ids,
        decoder_attention_mask,
        encoder_outputs,
        cache,
        inputs_embeds,
        decoder_inputs_embeds,
        use_cache,
        kwargs,
    ) -> tuple[BaseModelOutput, BaseModelOutputWithPastAndCrossAttentions]:
        kwargs.pop("return_dict", None)
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
    def __init__(self, config):
        super().__init__(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, S]
        attention_mask: torch.Tensor | None = None,  # [B, S]
        decoder_input_ids: torch.Tensor | None = None,  # [B, T]
        decoder_attention_mask: torch.Tensor | None = None,  # [B, past + T]
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: EncoderDecoderCache | None = None,  # the pre-5.24 name of `cache`
        **kwargs,
    ) -> Seq2SeqModelOutput:
        cache = cache if cache is not None else past_key_values
        enc, dec = self._run(
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            encoder_outputs,
            cache,
            inputs_embeds,
            decoder_inputs_embeds,
            use_cache,
            kwargs,
        )
        return Seq2SeqModelOutput(last_hidden_state=dec.last_hidden_state, **_seq2seq_fields(enc, dec))


class EncoderDecoderForConditionalGeneration(EncoderDecoderBase, GenerationMixin):
    """The LM head on the decoder; the loss is cross-entropy on unshifted labels (decoder inputs are the labels
    shifted right from `decoder_start_token_id`)."""

    _tied_weights_keys = {**EncoderDecoderBase._tied_weights_keys, "lm_head.weight": "shared.weight"}
    _keys_to_ignore_on_load_unexpected = None

    def __init__(self, config):
        super().__init__(config)
        self.logits_scale = self.recipe(config).logits_scale
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_right(labels, self.config.decoder_start_token_id, self.config.pad_token_id)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, S]
        attention_mask: torch.Tensor | None = None,  # [B, S]
        decoder_input_ids: torch.Tensor | None = None,  # [B, T]
        decoder_attention_mask: torch.Tensor | None = None,  # [B, past + T]
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B, T], -100 = not predicted
        use_cache: bool | None = None,
        past_key_values: EncoderDecoderCache | None = None,  # the pre-5.24 name of `cache`
        **kwargs,
    ) -> Seq2SeqLMOutput:
        cache = cache if cache is not None else past_key_values
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, (*(tokens_shape(input_ids, inputs_embeds)[:1] or (None,)), None))
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        enc, dec = self._run(
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            encoder_outputs,
            cache,
            inputs_embeds,
            decoder_inputs_embeds,
            use_cache,
            kwargs,
        )
        hidden = dec.last_hidden_state
        if self.logits_scale != 1.0:
            hidden = hidden * self.logits_scale
        logits = self.lm_head(hidden)  # [B, T, V]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return Seq2SeqLMOutput(loss=loss, logits=logits, **_seq2seq_fields(enc, dec))


class EncoderOnlyModel(EncoderDecoderPreTrainedModel):
    """The encoder stack alone (`AutoModelForTextEncoding`): embeddings for retrieval or a text-to-image model."""

    stack_class: type[Stack]
    _tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight"}
    _keys_to_ignore_on_load_unexpected = [r"^decoder\.", r"^lm_head\."]

    def __init__(self, config):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.hidden_size)
        self.encoder = self.stack_class(config, self.recipe(config).encoder)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.encoder.set_input_embeddings(value)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, S]
        attention_mask: torch.Tensor | None = None,  # [B, S]
        inputs_embeds: torch.Tensor | None = None,  # [B, S, C]
        **kwargs,
    ) -> BaseModelOutput:
        kwargs.pop("return_dict", None)
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs)
        return BaseModelOutput(
            last_hidden_state=out.last_hidden_state, hidden_states=out.hidden_states, attentions=out.attentions
        )
