"""Task models on top of an encoder, shared by every encoder architecture (text and images).

An architecture subclasses each one in a line, naming its config, recipe and base model class; the recipe's
`heads` give each task its head (heads.py), so the same class serves BERT's `lm_head.decoder`, ModernBERT's
`head` + `decoder` and a DistilBERT-like `head` + `classifier` alike.

Shapes: B batch, M choices, T time, C channels, V vocabulary, L labels, N tokens (the predicted ones).
"""

import torch
from transformers.modeling_outputs import (
    ImageClassifierOutput,
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
from .encoder import EncoderPreTrainedModel, EncoderStack
from .losses import (
    batch_labels_shapes,
    check_labels,
    cross_entropy,
    sequence_classification_loss,
    tokens_shape,
)
from .tasks import TaskModel


class EncoderTaskModel(EncoderPreTrainedModel, TaskModel):
    base_model_class: type[EncoderStack]

    def __init__(self, config):
        super().__init__(config)
        recipe = self.recipe(config)
        needs_pooler = any(recipe.heads[task].pool == "pooler" for task in self.tasks)
        self.model = self.base_model_class(config, add_pooling_layer=needs_pooler)
        if recipe.stack.pooler is not None and not needs_pooler:  # checkpoints often carry it (bert-base-uncased)
            self._keys_to_ignore_on_load_unexpected = [
                *(self._keys_to_ignore_on_load_unexpected or []),
                r"^model\.pooler\.",
            ]
        self.add_heads(config, recipe.heads, config.hidden_size)
        self.sparse_prediction = recipe.sparse_prediction
        self.post_init()

    def encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs):
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


class EncoderForMaskedLM(EncoderTaskModel):
    tasks = {"masked_lm": "vocab_size"}
    output_task = "masked_lm"

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
        out = self.encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        hidden = out.last_hidden_state  # [B, T, C]
        if self.sparse_prediction is not None and labels is not None:
            # Logits only where a label is set: [N, V] for the N predicted tokens, as stock ModernBERT.
            labels = labels.reshape(-1)
            keep = labels != self.sparse_prediction
            hidden, labels = hidden.reshape(labels.shape[0], -1)[keep], labels[keep]
        logits = self.run_head("masked_lm", hidden)  # [B, T, V] or [N, V]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


class EncoderForPreTraining(EncoderTaskModel):
    tasks = {"masked_lm": "vocab_size", "next_sentence": 2}
    output_task = "masked_lm"
    # The MLM and NSP losses have different item counts, so let Trainer average over accumulation steps.
    accepts_loss_kwargs = False

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
        out = self.encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.run_head("masked_lm", out.last_hidden_state)  # [B, T, V]
        nsp_logits = self.run_head("next_sentence", out.last_hidden_state, pooled=out.pooler_output)  # [B, 2]
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
    tasks = {"next_sentence": 2}

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
        out = self.encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.run_head("next_sentence", out.last_hidden_state, pooled=out.pooler_output)  # [B, 2]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class EncoderForSequenceClassification(EncoderTaskModel):
    tasks = {"sequence_classification": "num_labels"}

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
        shapes = batch_labels_shapes(input_ids, inputs_embeds, 1, self.config.num_labels)
        check_labels("labels", labels, *shapes, integer=False)  # regression and multi-label targets are scores
        num_items = kwargs.pop("num_items_in_batch", None)
        out = self.encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        pooled = getattr(out, "pooler_output", None)  # None: no pooler (ModernBERT's output has no such field)
        logits = self.run_head("sequence_classification", out.last_hidden_state, attention_mask, pooled)
        loss = sequence_classification_loss(logits, labels, self.config, num_items) if labels is not None else None
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class EncoderForMultipleChoice(EncoderTaskModel):
    tasks = {"multiple_choice": 1}  # a score per choice

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, M, T]
        attention_mask: torch.Tensor | None = None,  # [B, M, T]
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,  # [B, M, T, C]
        labels: torch.Tensor | None = None,  # [B], index of the right choice
        **kwargs,
    ) -> MultipleChoiceModelOutput:
        check_labels("labels", labels, *batch_labels_shapes(input_ids, inputs_embeds, 1))
        check_not_empty(tokens_shape(input_ids, inputs_embeds), "inputs_embeds" if input_ids is None else "input_ids")
        num_items = kwargs.pop("num_items_in_batch", None)
        choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(x: torch.Tensor | None, keep: int) -> torch.Tensor | None:  # [B, M, ...] -> [B * M, ...]
            return None if x is None else x.reshape(-1, *x.shape[x.dim() - keep :])

        mask = flat(attention_mask, 1)
        out = self.encode(
            flat(input_ids, 1), mask, flat(token_type_ids, 1), flat(position_ids, 1), flat(inputs_embeds, 2), kwargs
        )
        pooled = getattr(out, "pooler_output", None)
        scores = self.run_head("multiple_choice", out.last_hidden_state, mask, pooled)  # [B * M, 1]
        logits = scores.view(-1, choices)  # [B, M]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class EncoderForTokenClassification(EncoderTaskModel):
    tasks = {"token_classification": "num_labels"}

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
        out = self.encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.run_head("token_classification", out.last_hidden_state)  # [B, T, L]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class EncoderForQuestionAnswering(EncoderTaskModel):
    tasks = {"question_answering": "num_labels"}

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
        for name, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
            check_labels(name, positions, *batch_labels_shapes(input_ids, inputs_embeds, 1))
        kwargs.pop("num_items_in_batch", None)
        out = self.encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        return self.answer_spans(out, start_positions, end_positions)


class EncoderForImageClassification(EncoderTaskModel):
    """A classifier on the final [CLS] token; single-label, multi-label or regression losses as stock."""

    tasks = {"image_classification": "num_labels"}

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,  # [B, Ch, Hi, Wi]
        labels: torch.Tensor | None = None,  # [B] (class ids), [B] or [B, L] floats (regression, multi-label)
        interpolate_pos_encoding: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> ImageClassifierOutput:
        num_items = kwargs.pop("num_items_in_batch", None)
        kwargs.pop("return_dict", None)
        out = self.model(
            pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            attention_mask=attention_mask,
            return_dict=True,
            **kwargs,
        )
        logits = self.run_head("image_classification", out.last_hidden_state)  # [B, L]
        loss = sequence_classification_loss(logits, labels, self.config, num_items) if labels is not None else None
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
