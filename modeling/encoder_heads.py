"""Task models on top of an encoder, shared by every encoder architecture.

An architecture subclasses each one in a line, naming its config and base model class.

Shapes: B batch, N choices, T time, C channels, V vocabulary, L labels.
"""

import torch
from torch import nn
from transformers.modeling_outputs import (
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.models.bert.modeling_bert import BertForPreTrainingOutput as ForPreTrainingOutput
from transformers.utils.generic import can_return_tuple

from .embeddings import check_not_empty
from .encoder import EncoderModel, EncoderPreTrainedModel
from .heads import CLASSIFIERS_NEEDING_POOLER, MaskedLMHead, build_sequence_classifier
from .linear import Linear
from .losses import (
    batch_labels_shapes,
    check_labels,
    cross_entropy,
    sequence_classification_loss,
    span_loss,
    tokens_shape,
)

# Checkpoints often carry every head (bert-base-uncased holds pooler and NSP weights); heads that do not use
# them ignore them quietly on load.
UNUSED_HEAD_KEYS = [r"^model\.pooler\.", r"^nsp_head\.", r"^lm_head\."]


class EncoderTaskModel(EncoderPreTrainedModel):
    base_model_class: type[EncoderModel]

    def _encoder(self, config, add_pooling_layer: bool) -> EncoderModel:
        return self.base_model_class(config, add_pooling_layer=add_pooling_layer)

    def _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs):
        kwargs.pop("return_dict", None)
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )


class MaskedLMMixin:
    """Builds `lm_head` with the decoder tied to the word embeddings."""

    _tied_weights_keys = {"lm_head.decoder.weight": "model.embeddings.word_embeddings.weight"}

    def _build_lm_head(self, config) -> MaskedLMHead:
        recipe = self.base_model_class.recipe(config)
        return MaskedLMHead(
            config.hidden_size, config.vocab_size, recipe.lm_head_act, recipe.lm_head_norm, recipe.norm_eps
        )

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head.decoder = new_embeddings


class EncoderForMaskedLM(MaskedLMMixin, EncoderTaskModel):
    _keys_to_ignore_on_load_unexpected = [r"^model\.pooler\.", r"^nsp_head\."]

    def __init__(self, config):
        super().__init__(config)
        self.model = self._encoder(config, add_pooling_layer=False)
        self.lm_head = self._build_lm_head(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B, T], -100 = not predicted
        **kwargs,
    ) -> MaskedLMOutput:
        check_labels("labels", labels, tokens_shape(input_ids, inputs_embeds))
        num_items = kwargs.pop("num_items_in_batch", None)
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.lm_head(out.last_hidden_state)  # [B, T, V]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


class EncoderForPreTraining(MaskedLMMixin, EncoderTaskModel):
    # The MLM and NSP losses have different item counts, so let Trainer average over accumulation steps.
    accepts_loss_kwargs = False

    def __init__(self, config):
        super().__init__(config)
        self.model = self._encoder(config, add_pooling_layer=True)
        self.lm_head = self._build_lm_head(config)
        self.nsp_head = Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B, T]
        next_sentence_label: torch.Tensor | None = None,  # [B]
        **kwargs,
    ) -> ForPreTrainingOutput:
        check_labels("labels", labels, tokens_shape(input_ids, inputs_embeds))
        check_labels("next_sentence_label", next_sentence_label, *batch_labels_shapes(input_ids, inputs_embeds, 1))
        kwargs.pop("num_items_in_batch", None)
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.lm_head(out.last_hidden_state)  # [B, T, V]
        nsp_logits = self.nsp_head(out.pooler_output)  # [B, 2]
        loss = None
        if labels is not None and next_sentence_label is not None:
            loss = cross_entropy(logits, labels) + cross_entropy(nsp_logits, next_sentence_label)
        return ForPreTrainingOutput(
            loss=loss,
            prediction_logits=logits,
            seq_relationship_logits=nsp_logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )


class EncoderForNextSentencePrediction(EncoderTaskModel):
    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]

    def __init__(self, config):
        super().__init__(config)
        self.model = self._encoder(config, add_pooling_layer=True)
        self.nsp_head = Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B], 0 = B follows A
        **kwargs,
    ) -> NextSentencePredictorOutput:
        check_labels("labels", labels, *batch_labels_shapes(input_ids, inputs_embeds, 1))
        num_items = kwargs.pop("num_items_in_batch", None)
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.nsp_head(out.pooler_output)  # [B, 2]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class EncoderForSequenceClassification(EncoderTaskModel):
    _keys_to_ignore_on_load_unexpected = UNUSED_HEAD_KEYS

    def __init__(self, config):
        super().__init__(config)
        recipe = self.base_model_class.recipe(config)
        kind = recipe.sequence_classifier
        self.model = self._encoder(config, add_pooling_layer=kind in CLASSIFIERS_NEEDING_POOLER)
        self.classifier = build_sequence_classifier(
            kind, config.hidden_size, config.num_labels, recipe.classifier_dropout
        )
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B] (class ids), [B] or [B, L] floats (regression, multi-label)
        **kwargs,
    ) -> SequenceClassifierOutput:
        check_labels("labels", labels, *batch_labels_shapes(input_ids, inputs_embeds, 1, self.config.num_labels))
        num_items = kwargs.pop("num_items_in_batch", None)
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.classifier(out)  # [B, L]
        loss = sequence_classification_loss(logits, labels, self.config, num_items) if labels is not None else None
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class EncoderForMultipleChoice(EncoderTaskModel):
    _keys_to_ignore_on_load_unexpected = [r"^lm_head\.", r"^nsp_head\."]

    def __init__(self, config):
        super().__init__(config)
        self.model = self._encoder(config, add_pooling_layer=True)
        self.dropout = nn.Dropout(self.base_model_class.recipe(config).multiple_choice_dropout)
        self.classifier = Linear(config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, N, T]
        attention_mask: torch.Tensor | None = None,  # [B, N, T]
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,  # [B, N, T, C]
        labels: torch.Tensor | None = None,  # [B], index of the right choice
        **kwargs,
    ) -> MultipleChoiceModelOutput:
        check_labels("labels", labels, *batch_labels_shapes(input_ids, inputs_embeds, 1))
        check_not_empty(tokens_shape(input_ids, inputs_embeds), "inputs_embeds" if input_ids is None else "input_ids")
        num_items = kwargs.pop("num_items_in_batch", None)
        choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(x: torch.Tensor | None, keep: int) -> torch.Tensor | None:  # [B, N, ...] -> [B * N, ...]
            return None if x is None else x.reshape(-1, *x.shape[x.dim() - keep :])

        out = self._encode(
            flat(input_ids, 1),
            flat(attention_mask, 1),
            flat(token_type_ids, 1),
            flat(position_ids, 1),
            flat(inputs_embeds, 2),
            kwargs,
        )
        logits = self.classifier(self.dropout(out.pooler_output)).view(-1, choices)  # [B * N, 1] -> [B, N]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class EncoderForTokenClassification(EncoderTaskModel):
    _keys_to_ignore_on_load_unexpected = UNUSED_HEAD_KEYS

    def __init__(self, config):
        super().__init__(config)
        self.model = self._encoder(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(self.base_model_class.recipe(config).classifier_dropout)
        self.classifier = Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B, T], -100 = ignored
        **kwargs,
    ) -> TokenClassifierOutput:
        check_labels("labels", labels, tokens_shape(input_ids, inputs_embeds))
        num_items = kwargs.pop("num_items_in_batch", None)
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # [B, T, L]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class EncoderForQuestionAnswering(EncoderTaskModel):
    _keys_to_ignore_on_load_unexpected = UNUSED_HEAD_KEYS

    def __init__(self, config):
        super().__init__(config)
        self.model = self._encoder(config, add_pooling_layer=False)
        self.qa_outputs = Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,  # [B]
        end_positions: torch.Tensor | None = None,  # [B]
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        check_labels("start_positions", start_positions, *batch_labels_shapes(input_ids, inputs_embeds, 1))
        check_labels("end_positions", end_positions, *batch_labels_shapes(input_ids, inputs_embeds, 1))
        kwargs.pop("num_items_in_batch", None)
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).split(1, dim=-1)  # 2 x [B, T, 1]
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )
