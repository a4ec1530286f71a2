"""The causal decoder stack: embeddings -> blocks -> final norm, with a key/value cache for generation.

An architecture supplies `recipe(config) -> DecoderRecipe`; everything else here is shared (GPT-2, Mixtral).
The cache follows transformers 5.x: the forward accepts both `cache` (5.24) and `past_key_values` (5.23),
builds a `DynamicCache` when `use_cache` is on and none is given, and returns it under the field name the
installed transformers uses.

Shapes: B batch, T new time steps, P cached steps, C channels, V vocabulary, L labels.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.modeling_utils import slice_logits_to_keep
from transformers.utils import logging
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .attention import Attention
from .block import Block, BlockSpec
from .embeddings import check_position_ids, check_token_ids
from .linear import Linear
from .losses import batch_labels_shapes, check_labels, cross_entropy, sequence_classification_loss, tokens_shape
from .norms import build_norm
from .pretrained import FivefoldPreTrainedModel
from .rotary import RotaryEmbedding

logger = logging.get_logger(__name__)

# transformers 5.24 renamed the output field `past_key_values` to `cache`; write whichever this version has.
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


@dataclass(frozen=True)
class DecoderEmbeddingSpec:
    vocab_size: int
    hidden_size: int
    padding_idx: int | None  # the word table's padding row (kept at zero, no gradient); None: none
    max_positions: int | None  # learned absolute positions (GPT-2); None: positions live elsewhere (rotary)
    dropout: float
    token_types_from_words: bool = False  # GPT-2 embeds token_type_ids with the word table


@dataclass(frozen=True)
class RotarySpec:
    head_dim: int
    theta: float


@dataclass(frozen=True)
class DecoderRecipe:
    embeddings: DecoderEmbeddingSpec
    blocks: tuple[BlockSpec, ...]
    final_norm: str  # key in NORMS
    norm_eps: float
    rotary: RotarySpec | None = None  # one (cos, sin) table shared by every rotary attention layer
    sliding_window: int | None = None  # local attention: each token sees at most this many keys
    classifier_dropout: float = 0.1  # before the token classifier


def check_attention_mask(attention_mask: torch.Tensor | None, batch: int, length: int) -> None:
    """A [B, P + T] padding mask covers the cached and the new steps; a ready-made 4D mask passes as in stock."""
    if attention_mask is None or attention_mask.dim() == 4:
        return
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < length:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, expected (batch, past + new tokens) with "
            f"batch = {batch} and at least {length} tokens"
        )


class DecoderEmbeddings(nn.Module):
    """Word embeddings (+ learned absolute positions) (+ GPT-2's token types through the word table), dropout."""

    def __init__(self, spec: DecoderEmbeddingSpec):
        super().__init__()
        self.spec = spec
        self.word_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size, padding_idx=spec.padding_idx)
        self.position_embeddings = (
            nn.Embedding(spec.max_positions, spec.hidden_size) if spec.max_positions is not None else None
        )
        self.dropout = nn.Dropout(spec.dropout)

    def forward(
        self,
        input_ids: torch.Tensor | None,  # [B, T]
        inputs_embeds: torch.Tensor | None,  # [B, T, C]
        position_ids: torch.Tensor,  # [B, T] or [1, T]
        token_type_ids: torch.Tensor | None = None,  # [B, T]
    ) -> torch.Tensor:  # [B, T, C]
        if inputs_embeds is None:
            # The live table size, not the configured one: resize_token_embeddings may have grown it.
            check_token_ids(input_ids, self.word_embeddings.num_embeddings)
            inputs_embeds = self.word_embeddings(input_ids)
        hidden = inputs_embeds
        if self.position_embeddings is not None:
            check_position_ids(position_ids, self.spec.max_positions)
            hidden = hidden + self.position_embeddings(position_ids)
        if token_type_ids is not None:
            if not self.spec.token_types_from_words:
                raise ValueError("this model has no token types: pass token_type_ids=None")
            check_token_ids(token_type_ids, self.word_embeddings.num_embeddings)
            hidden = hidden + self.word_embeddings(token_type_ids)
        return self.dropout(hidden)


class DecoderPreTrainedModel(FivefoldPreTrainedModel):
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["DecoderEmbeddings", "Block"]
    _can_record_outputs = {"hidden_states": Block, "attentions": Attention}

    @staticmethod
    def recipe(config) -> DecoderRecipe:
        raise NotImplementedError("a decoder architecture defines recipe(config)")


class DecoderModel(DecoderPreTrainedModel):
    # A mixture-of-experts decoder returns MoeModelOutputWithPast, which has room for the router logits.
    output_class = BaseModelOutputWithPast

    def __init__(self, config):
        super().__init__(config)
        recipe = self.recipe(config)
        self.sliding_window = recipe.sliding_window
        self.embeddings = DecoderEmbeddings(recipe.embeddings)
        self.rotary = RotaryEmbedding(recipe.rotary.head_dim, recipe.rotary.theta) if recipe.rotary else None
        self.layers = nn.ModuleList(Block(config, spec, i) for i, spec in enumerate(recipe.blocks))
        self.norm = build_norm(recipe.final_norm, config.hidden_size, recipe.norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, P + T], 1 = token, 0 = padding
        position_ids: torch.Tensor | None = None,  # [B, T]; default P, P + 1, ... as in stock
        cache=None,  # a transformers Cache holding P steps (transformers >= 5.24 passes it under this name)
        inputs_embeds: torch.Tensor | None = None,  # [B, T, C]
        use_cache: bool | None = None,
        token_type_ids: torch.Tensor | None = None,  # [B, T], only where the recipe embeds token types
        past_key_values=None,  # the same cache under its transformers <= 5.23 name
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        cache = cache if cache is not None else past_key_values
        kwargs.pop("output_attentions", None)  # read by capture_outputs; the kernels must not see them
        kwargs.pop("output_hidden_states", None)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            use_cache = False  # checkpointed layers recompute their forward and would append to the cache twice
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)

        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        check_attention_mask(attention_mask, batch, length)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            device = (input_ids if input_ids is not None else inputs_embeds).device
            position_ids = torch.arange(past, past + length, device=device).unsqueeze(0)  # [1, T]
        hidden = self.embeddings(input_ids, inputs_embeds, position_ids, token_type_ids)  # [B, T, C]

        mask = self._attention_mask(hidden, attention_mask, cache, position_ids)
        position_embeddings = self.rotary(position_ids, hidden.dtype) if self.rotary is not None else None
        if self.sliding_window is not None:
            kwargs["sliding_window"] = self.sliding_window  # for kernels that take the window, not a mask (flash)
        for layer in self.layers:
            hidden = layer(hidden, mask, position_embeddings, cache=cache, position_ids=position_ids, **kwargs)
        hidden = self.norm(hidden)
        return self.output_class(last_hidden_state=hidden, **{CACHE_FIELD: cache if use_cache else None})

    def _attention_mask(self, hidden: torch.Tensor, attention_mask, cache, position_ids):
        """The mask in the form the selected kernel wants, built by transformers' mask functions, except for the
        commonest call of all: one new token per row, decoded with sdpa or eager attention. That token sees every
        cached key, so padding alone hides any and the mask is the padding mask, [B, 1, 1, P + 1]."""
        past = cache.get_seq_length() if cache is not None else 0
        if (
            hidden.shape[1] == 1
            and self.sliding_window is None
            and self.config._attn_implementation in ("sdpa", "eager")
            and (attention_mask is None or (attention_mask.dim() == 2 and attention_mask.shape[1] == past + 1))
        ):
            return None if attention_mask is None else attention_mask[:, None, None, :].bool()
        make_mask = create_causal_mask if self.sliding_window is None else create_sliding_window_causal_mask
        # The cache goes positionally: its keyword is `cache` in 5.24 and `past_key_values` before.
        return make_mask(self.config, hidden, attention_mask, cache, position_ids)


class DecoderTaskModel(DecoderPreTrainedModel):
    base_model_class: type[DecoderModel]

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def _decode(self, input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, kwargs):
        kwargs.pop("return_dict", None)
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )


class DecoderForCausalLM(DecoderTaskModel, GenerationMixin):
    """Next-token logits (tied to the word embeddings when `config.tie_word_embeddings`), loss on shifted labels."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.word_embeddings.weight"}
    output_class = CausalLMOutputWithPast

    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    def auxiliary_outputs(self, outputs, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor | None, dict]:
        """(a loss added to the LM loss when labels are given, or None; extra output fields). A mixture of experts
        returns its load-balancing loss and router logits here; dense decoders have none."""
        return None, {}

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, P + T]
        position_ids: torch.Tensor | None = None,  # [B, T]
        cache=None,
        inputs_embeds: torch.Tensor | None = None,  # [B, T, C]
        labels: torch.Tensor | None = None,  # [B, T], unshifted; -100 = not predicted
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,  # 0: logits for every step; n: only the last n
        past_key_values=None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        cache = cache if cache is not None else past_key_values
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, tokens_shape(input_ids, inputs_embeds))
        out = self._decode(input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, kwargs)
        logits = self.lm_head(slice_logits_to_keep(out.last_hidden_state, logits_to_keep))  # [B, T', V]
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config.vocab_size, num_items_in_batch=num_items)
        auxiliary_loss, extra = self.auxiliary_outputs(out, attention_mask)
        if loss is not None and auxiliary_loss is not None:
            loss = loss + auxiliary_loss.to(loss.device)
        return self.output_class(
            loss=loss,
            logits=logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            **{CACHE_FIELD: getattr(out, CACHE_FIELD)},
            **extra,
        )


def last_token_indices(input_ids: torch.Tensor | None, pad_token_id: int | None, batch: int, name: str):
    """Where each row's last real token sits: the rightmost non-pad token (left or right padding), as in stock."""
    if pad_token_id is None and batch != 1:
        raise ValueError("Cannot handle batch sizes > 1 if no padding token is defined.")
    if pad_token_id is None:
        return -1
    if input_ids is None:
        logger.warning_once(
            f"{name} will not detect padding tokens in `inputs_embeds`. Results may be unexpected if using padding "
            "tokens in conjunction with `inputs_embeds.`"
        )
        return -1
    is_token = input_ids.ne(pad_token_id).int()
    steps = torch.arange(input_ids.shape[-1], device=input_ids.device, dtype=torch.int32)
    return (steps * is_token).argmax(-1)  # [B]


class DecoderForSequenceClassification(DecoderTaskModel):
    """Scores the last real token of each row (stock GPT-2 / Mixtral semantics)."""

    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.score = Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B] (class ids), [B] or [B, L] floats (regression, multi-label)
        use_cache: bool | None = None,
        past_key_values=None,
        **kwargs,
    ) -> SequenceClassifierOutputWithPast:
        cache = cache if cache is not None else past_key_values
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, *batch_labels_shapes(input_ids, inputs_embeds, 1, self.config.num_labels))
        out = self._decode(input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, kwargs)
        logits = self.score(out.last_hidden_state)  # [B, T, L]
        batch = logits.shape[0]
        last = last_token_indices(input_ids, self.config.pad_token_id, batch, type(self).__name__)
        pooled = logits[torch.arange(batch, device=logits.device), last]  # [B, L]
        loss = sequence_classification_loss(pooled, labels, self.config, num_items) if labels is not None else None
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=pooled,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            **{CACHE_FIELD: getattr(out, CACHE_FIELD)},
        )


class DecoderForTokenClassification(DecoderTaskModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.dropout = nn.Dropout(self.base_model_class.recipe(config).classifier_dropout)
        self.classifier = Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B, T], -100 = ignored
        use_cache: bool | None = None,
        past_key_values=None,
        **kwargs,
    ) -> TokenClassifierOutput:
        cache = cache if cache is not None else past_key_values
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, tokens_shape(input_ids, inputs_embeds))
        out = self._decode(input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, kwargs)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # [B, T, L]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
