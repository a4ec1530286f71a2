"""ModernBERT: rotary positions with a base per layer type, global attention every few layers and a sliding
window between, GeGLU feed-forward, pre-norm LayerNorms without bias, an embedding norm and a final norm.

The recipe maps the stock `ModernBertConfig` onto shared parts. Its task heads share one shape, unlike BERT's:
pool (classifiers), then dense -> activation -> norm (`head`), dropout, and a linear layer.

Shapes: B batch, N choices, T time, C channels, V vocabulary, L labels.
"""

import torch
from torch import nn
from transformers.modeling_outputs import (
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils.generic import can_return_tuple

from ..configuration.modernbert import FivefoldModernBertConfig
from .attention import AttentionSpec
from .block import BlockSpec
from .embeddings import EmbeddingSpec, check_not_empty
from .encoder import EncoderModel, EncoderPreTrainedModel, EncoderRecipe
from .feedforward import FeedForwardSpec, activation
from .linear import Linear
from .losses import (
    batch_labels_shapes,
    check_labels,
    cross_entropy,
    sequence_classification_loss,
    span_loss,
    tokens_shape,
)
from .norms import build_norm


def norm_kind(config) -> str:
    return "layernorm" if config.norm_bias else "layernorm_nobias"


def modernbert_recipe(config) -> EncoderRecipe:
    norm = norm_kind(config)

    def block(index: int) -> BlockSpec:
        return BlockSpec(
            attention=AttentionSpec(
                hidden_size=config.hidden_size,
                num_heads=config.num_attention_heads,
                bias=config.attention_bias,
                out_bias=config.attention_bias,
                dropout=config.attention_dropout,
                positions="rotary",
            ),
            feedforward=FeedForwardSpec(
                kind="gated",
                hidden_size=config.hidden_size,
                intermediate_size=config.intermediate_size,
                activation=config.hidden_activation,
                bias=config.mlp_bias,
                dropout=config.mlp_dropout,
            ),
            norm=norm,
            norm_eps=config.norm_eps,
            prenorm=True,
            dropout=config.attention_dropout,  # stock drops the attention output with the attention rate
            mlp_out_dropout=0.0,
            attn_input_norm=index > 0,  # the embedding norm already normalised the first block's input
        )

    sliding = [kind == "sliding_attention" for kind in config.layer_types]
    thetas = {kind: config.rope_parameters[kind]["rope_theta"] for kind in set(config.layer_types)}
    return EncoderRecipe(
        embeddings=EmbeddingSpec(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            pad_token_id=config.pad_token_id,
            max_positions=0,  # rotary positions, in attention
            type_vocab_size=0,
            norm=norm,
            norm_eps=config.norm_eps,
            dropout=config.embedding_dropout,
        ),
        blocks=tuple(block(i) for i in range(config.num_hidden_layers)),
        final_norm=norm,
        norm_eps=config.norm_eps,
        lm_head_act=config.classifier_activation,
        lm_head_norm=norm,
        sequence_classifier=config.classifier_pooling,
        classifier_dropout=config.classifier_dropout,
        multiple_choice_dropout=config.classifier_dropout,
        # `local_attention` is the whole window: keys within half of it on either side (as stock's sliding_window).
        windows=tuple(config.local_attention // 2 if s else None for s in sliding),
        rotary_thetas=tuple(thetas[kind] for kind in config.layer_types),
    )


class FivefoldModernBertPreTrainedModel(EncoderPreTrainedModel):
    config: FivefoldModernBertConfig
    recipe = staticmethod(modernbert_recipe)


class FivefoldModernBertModel(FivefoldModernBertPreTrainedModel, EncoderModel):
    def __init__(self, config, add_pooling_layer: bool = False):
        super().__init__(config, add_pooling_layer=False)  # ModernBERT has no pooler


class PredictionHead(nn.Module):
    """dense -> activation -> norm, before the decoder or a classifier."""

    def __init__(self, config):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = activation(config.classifier_activation)
        self.norm = build_norm(
            "layernorm" if config.norm_bias else "layernorm_nobias", config.hidden_size, config.norm_eps
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # [..., C] -> [..., C]
        return self.norm(self.act(self.dense(hidden_states)))


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, how: str, cls_first_token: bool) -> torch.Tensor:
    """[B, T, C] -> [B, C]: the CLS token or the mean over real tokens. `cls_first_token=False` takes the first
    real token instead of position 0 (stock's multiple choice, which also allows left padding)."""
    if how == "mean":
        if attention_mask is None:
            return hidden.mean(dim=1)
        mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    if cls_first_token or attention_mask is None:
        return hidden[:, 0]
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), attention_mask.argmax(dim=-1)]


class ModernBertTaskModel(FivefoldModernBertPreTrainedModel):
    """The encoder and `head` every ModernBERT task model shares."""

    def __init__(self, config):
        super().__init__(config)
        self.model = FivefoldModernBertModel(config)
        self.head = PredictionHead(config)

    def _encode(self, input_ids, attention_mask, position_ids, inputs_embeds, kwargs):
        kwargs.pop("return_dict", None)
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )


class ModernBertClassifierModel(ModernBertTaskModel):
    """head -> dropout -> linear, with `num_outputs(config)` outputs."""

    _keys_to_ignore_on_load_unexpected = [r"^decoder\."]  # a masked-LM checkpoint's decoder

    @staticmethod
    def num_outputs(config) -> int:
        return config.num_labels

    def __init__(self, config):
        super().__init__(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = Linear(config.hidden_size, self.num_outputs(config))
        self.post_init()

    def _classify(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.head(hidden)))


class FivefoldModernBertForMaskedLM(ModernBertTaskModel):
    _tied_weights_keys = {"decoder.weight": "model.embeddings.word_embeddings.weight"}
    _keys_to_ignore_on_load_unexpected = [r"^classifier\."]

    def __init__(self, config):
        super().__init__(config)
        self.decoder = Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B, T], -100 = not predicted
        **kwargs,
    ) -> MaskedLMOutput:
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, tokens_shape(input_ids, inputs_embeds))
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        hidden = out.last_hidden_state  # [B, T, C]
        if self.config.sparse_prediction and labels is not None:
            # Logits only where a label is set: [M, V] for the M predicted tokens, as stock.
            labels = labels.reshape(-1)
            keep = labels != self.config.sparse_pred_ignore_index
            hidden, labels = hidden.reshape(labels.shape[0], -1)[keep], labels[keep]
        logits = self.decoder(self.head(hidden))
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


class FivefoldModernBertForSequenceClassification(ModernBertClassifierModel):
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B] (class ids), [B] or [B, L] floats (regression, multi-label)
        **kwargs,
    ) -> SequenceClassifierOutput:
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, *batch_labels_shapes(input_ids, inputs_embeds, 1, self.config.num_labels))
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        pooled = pool(out.last_hidden_state, attention_mask, self.config.classifier_pooling, cls_first_token=True)
        logits = self._classify(pooled)  # [B, L]
        loss = sequence_classification_loss(logits, labels, self.config, num_items) if labels is not None else None
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class FivefoldModernBertForTokenClassification(ModernBertClassifierModel):
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # [B, T], -100 = ignored
        **kwargs,
    ) -> TokenClassifierOutput:
        num_items = kwargs.pop("num_items_in_batch", None)
        check_labels("labels", labels, tokens_shape(input_ids, inputs_embeds))
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        logits = self._classify(out.last_hidden_state)  # [B, T, L]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class FivefoldModernBertForQuestionAnswering(ModernBertClassifierModel):
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,  # [B]
        end_positions: torch.Tensor | None = None,  # [B]
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        kwargs.pop("num_items_in_batch", None)
        for name, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
            check_labels(name, positions, *batch_labels_shapes(input_ids, inputs_embeds))
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        start_logits, end_logits = self._classify(out.last_hidden_state).split(1, dim=-1)  # 2 x [B, T, 1]
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


class FivefoldModernBertForMultipleChoice(ModernBertClassifierModel):
    @staticmethod
    def num_outputs(config) -> int:
        return 1  # a score per choice

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, N, T]
        attention_mask: torch.Tensor | None = None,  # [B, N, T]
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,  # [B, N, T, C]
        labels: torch.Tensor | None = None,  # [B], index of the right choice
        **kwargs,
    ) -> MultipleChoiceModelOutput:
        num_items = kwargs.pop("num_items_in_batch", None)
        check_not_empty(tokens_shape(input_ids, inputs_embeds), "inputs_embeds" if input_ids is None else "input_ids")
        check_labels("labels", labels, *batch_labels_shapes(input_ids, inputs_embeds, 1))
        choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(x: torch.Tensor | None, keep: int) -> torch.Tensor | None:  # [B, N, ...] -> [B * N, ...]
            return None if x is None else x.reshape(-1, *x.shape[x.dim() - keep :])

        mask = flat(attention_mask, 1)
        if "token_type_ids" in kwargs:  # none in ModernBERT, but tokenizers may send zeros
            kwargs["token_type_ids"] = flat(kwargs["token_type_ids"], 1)
        out = self._encode(flat(input_ids, 1), mask, flat(position_ids, 1), flat(inputs_embeds, 2), kwargs)
        pooled = pool(out.last_hidden_state, mask, self.config.classifier_pooling, cls_first_token=False)
        logits = self._classify(pooled).view(-1, choices)  # [B * N, 1] -> [B, N]
        loss = cross_entropy(logits, labels, num_items) if labels is not None else None
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )
