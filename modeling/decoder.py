"""The causal decoder: the shared stack with a key/value cache, and its task models (GPT-2, Mixtral, Llama, ...).

An architecture supplies `recipe(config) -> Recipe`; everything else here is shared. The cache follows
transformers 5.24: the forward takes `cache` (the old name `past_key_values` is still accepted, as in stock),
builds a `DynamicCache` when `use_cache` is on and none is given, and returns it under the field name the
installed transformers uses.

Shapes: B batch, T time, P cached steps, C channels, V vocabulary, L labels.
"""

import contextlib

import torch
from transformers import GenerationMixin
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.modeling_utils import slice_logits_to_keep
from transformers.utils import logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .batching import ContinuousBatching, is_paged
from .heads import last_real_token
from .kernel_warnings import warn_no_attention_weights
from .kernels import causal_masks, check_attention_mask
from .losses import batch_labels_shapes, check_labels, cross_entropy, sequence_classification_loss, tokens_shape
from .padding import is_packed_row
from .pretrained import FivefoldPreTrainedModel
from .stack import Recipe, Stack
from .tasks import TaskModel
from .tracing import clears_stale_capture, without_branches

# Under transformers' logger, so that its verbosity (`set_verbosity_error`) silences these as it does stock's.
logger = logging.get_logger(f"transformers.{__name__}")

# transformers 5.24 renamed the output field `past_key_values` to `cache`; write whichever this version has.
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
# Forwards take `cache`; the name before 5.24 is accepted and mapped onto it, as stock does.
accepts_past_key_values = deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")


class DecoderPreTrainedModel(FivefoldPreTrainedModel):
    @staticmethod
    def recipe(config) -> Recipe:
        raise NotImplementedError("a decoder architecture defines recipe(config)")


class DecoderModel(DecoderPreTrainedModel, Stack):
    # A mixture-of-experts decoder returns MoeModelOutputWithPast, which has room for the router logits.
    output_class = BaseModelOutputWithPast

    def __init__(self, config):
        super().__init__(config, self.recipe(config).stack)
        self.post_init()

    @accepts_past_key_values
    @clears_stale_capture
    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, P + T], 1 = token, 0 = padding
        position_ids: torch.Tensor | None = None,  # [B, T]; default P, P + 1, ... as in stock
        cache=None,  # a transformers Cache holding P steps
        inputs_embeds: torch.Tensor | None = None,  # [B, T, C]
        use_cache: bool | None = None,
        token_type_ids: torch.Tensor | None = None,  # [B, T], only where the recipe embeds token types
        **kwargs,
    ) -> BaseModelOutputWithPast:
        self.embeddings.check_inputs(input_ids, inputs_embeds)
        # Read by capture_outputs; the kernels must not see it.
        warn_no_attention_weights(self.config, kwargs.pop("output_attentions", None))
        kwargs.pop("output_hidden_states", None)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if self.training and torch.is_grad_enabled() and self.checkpointing():
            use_cache = False  # checkpointed layers recompute their forward and would append to the cache twice
        made_here = use_cache and cache is None
        if made_here:
            cache = DynamicCache(config=self.config)

        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        if not is_paged(cache):  # continuous batching's masks are its own (batching.paged_masks)
            check_attention_mask(attention_mask, batch, length, cached=True)
        # Documents packed in one row (the caller's position ids restarting, no mask): transformers' mask functions
        # keep each document to itself when they get no cache, which a fresh one holds nothing of yet. Reading the
        # ids is a data-dependent branch a graph cannot hold: a traced call leaves packing to the mask functions,
        # which build it into the mask without a cache (as stock does) and read none with one.
        packed = (
            not torch.compiler.is_compiling()
            and is_packed_row(position_ids, attention_mask)
            and (cache is None or (not is_paged(cache) and cache.get_seq_length(self.first_layer) == 0))
        )
        if position_ids is None:
            past = cache.get_seq_length(self.first_layer) if cache is not None else 0
            device = (input_ids if input_ids is not None else inputs_embeds).device
            # T positions, then shifted: an exported step's `past` is read from the cache, a size no tracer can bound
            position_ids = (torch.arange(length, device=device) + past).unsqueeze(0)  # [1, T]
        hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # [B, T, C]
        cached = None if packed or made_here else cache  # a cache made here holds nothing yet: none to the masks
        masks = causal_masks(self.config, hidden, attention_mask, cached, position_ids, self.windows, self.first_layer)
        # A compiled call that fills a cache it made must not branch (tracing.py).
        branching = without_branches() if made_here and torch.compiler.is_compiling() else contextlib.nullcontext()
        with branching:
            hidden = self.run_blocks(hidden, masks, position_ids, cache=cache, position_ids=position_ids, **kwargs)
        hidden = self.dropout(self.norm(hidden))
        return self.output_class(last_hidden_state=hidden, **{CACHE_FIELD: cache if use_cache else None})


class DecoderTaskModel(DecoderPreTrainedModel, TaskModel):
    base_model_class: type[DecoderModel]

    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.add_heads(config, self.recipe(config).heads, config.hidden_size)
        self.post_init()

    def decode(self, input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, kwargs):
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


class DecoderForCausalLM(DecoderTaskModel, ContinuousBatching, GenerationMixin):
    """Next-token logits (tied to the word embeddings when `config.tie_word_embeddings`), loss on shifted labels."""

    tasks = {"causal_lm": "vocab_size"}
    output_task = "causal_lm"
    output_class = CausalLMOutputWithPast
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}  # as stock's; the stack's is the config's

    def __init__(self, config):
        super().__init__(config)
        # Trainer counts a causal LM's labels after the shift only for this loss type, which transformers reads off
        # the class name: GPT2LMHeadModel's names none, and its loss would be divided by one label too many per row.
        self.loss_type = "ForCausalLM"
        self.vocab_size = config.vocab_size  # stock's attribute (transformers' resize updates it)

    def auxiliary_outputs(self, outputs, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor | None, dict]:
        """(a loss added to the LM loss when labels are given, or None; extra output fields). A mixture of experts
        returns its load-balancing loss and router logits here; dense decoders have none."""
        return None, {}

    @accepts_past_key_values
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
        token_type_ids: torch.Tensor | None = None,  # [B, T]; named, so that Trainer keeps a dataset's column
        **kwargs,
    ) -> CausalLMOutputWithPast:
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, tokens_shape(input_ids, inputs_embeds))
        kwargs["token_type_ids"] = token_type_ids
        out = self.decode(input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, kwargs)
        logits = self.run_head("causal_lm", slice_logits_to_keep(out.last_hidden_state, logits_to_keep))  # [B, T', V]
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


def real_tokens(input_ids: torch.Tensor | None, pad_token_id: int | None, batch: int, name: str) -> torch.Tensor | None:
    """[B, T] True at non-pad tokens, for finding each row's last real token as stock does (by the pad id, with
    left or right padding); None where every row's last position is its last token."""
    if pad_token_id is None and batch != 1:
        raise ValueError("Cannot handle batch sizes > 1 if no padding token is defined.")
    if pad_token_id is None:
        return None
    if input_ids is None:
        logger.warning_once(
            f"{name} will not detect padding tokens in `inputs_embeds`. Results may be unexpected if using padding "
            "tokens in conjunction with `inputs_embeds.`"
        )
        return None
    return input_ids.ne(pad_token_id)


class DecoderForSequenceClassification(DecoderTaskModel):
    """Scores the last real token of each row (stock GPT-2 / Mixtral semantics). As stock, every token is scored
    and the last real one's scores are taken: pooling first gives the same numbers, but not to the last bit."""

    tasks = {"sequence_classification": "num_labels"}

    @accepts_past_key_values
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
        token_type_ids: torch.Tensor | None = None,  # [B, T]; named, so that Trainer keeps a dataset's column
        **kwargs,
    ) -> SequenceClassifierOutputWithPast:
        num_items = kwargs.pop("num_items_in_batch", None)
        shapes = batch_labels_shapes(input_ids, inputs_embeds, 1, self.config.num_labels)
        check_labels("labels", labels, *shapes, integer=False)  # regression and multi-label targets are scores
        kwargs["token_type_ids"] = token_type_ids
        out = self.decode(input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, kwargs)
        batch = out.last_hidden_state.shape[0]
        real = real_tokens(input_ids, self.config.pad_token_id, batch, type(self).__name__)
        scores = self.run_head("sequence_classification", out.last_hidden_state)  # [B, T, L]
        logits = last_real_token(scores, real, None)  # [B, L]
        loss = sequence_classification_loss(logits, labels, self.config, num_items) if labels is not None else None
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            **{CACHE_FIELD: getattr(out, CACHE_FIELD)},
        )


class DecoderForTokenClassification(DecoderTaskModel):
    tasks = {"token_classification": "num_labels"}

    @accepts_past_key_values
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
        token_type_ids: torch.Tensor | None = None,  # [B, T]; named, so that Trainer keeps a dataset's column
        **kwargs,
    ) -> TokenClassifierOutput:
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, tokens_shape(input_ids, inputs_embeds))
        kwargs["token_type_ids"] = token_type_ids
        out = self.decode(input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, kwargs)
        logits = self.run_head("token_classification", out.last_hidden_state)  # [B, T, L]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class DecoderForQuestionAnswering(DecoderTaskModel):
    """Start and end logits for every token (stock's `GenericForQuestionAnswering`: a linear layer to 2)."""

    tasks = {"question_answering": 2}

    @accepts_past_key_values
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,  # [B]
        end_positions: torch.Tensor | None = None,  # [B]
        use_cache: bool | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        for name, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
            check_labels(name, positions, *batch_labels_shapes(input_ids, inputs_embeds, 1))
        kwargs.pop("num_items_in_batch", None)
        out = self.decode(input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, kwargs)
        return self.answer_spans(out, start_positions, end_positions)
