"""BERT: learned absolute positions and token types, post-norm blocks, GELU feed-forward, a [CLS] pooler.

The recipe maps the stock `BertConfig` fields onto shared parts; the classes below are one-line wirings.
`bert_block` is also the block of the architectures that share BERT's config fields (RoBERTa, ViT).
"""

from ..configuration.bert import FivefoldBertConfig
from .attention import CROSS_ATTENTIONS_RECORD, AttentionSpec
from .block import BlockSpec
from .embeddings import EmbeddingSpec
from .encoder import EncoderModel, EncoderPreTrainedModel
from .encoder_tasks import (
    EncoderForMaskedLM,
    EncoderForMultipleChoice,
    EncoderForNextSentencePrediction,
    EncoderForPreTraining,
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from .feedforward import FeedForwardSpec
from .heads import HeadSpec, TransformSpec
from .stack import Recipe, StackSpec
from .tasks import stock_name_of_the_base


def bert_block(config, prenorm: bool, qkv_bias: bool = True) -> BlockSpec:
    """One dense GELU feed-forward and LayerNorm, from `hidden_size`, `num_attention_heads`, `intermediate_size`,
    `hidden_act`, `layer_norm_eps`, `hidden_dropout_prob` and `attention_probs_dropout_prob`."""
    return BlockSpec(
        attention=AttentionSpec(
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            bias=qkv_bias,
            dropout=config.attention_probs_dropout_prob,
        ),
        feedforward=FeedForwardSpec(
            kind="dense",
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            activation=config.hidden_act,
        ),
        norm="layernorm",
        norm_eps=config.layer_norm_eps,
        prenorm=prenorm,
        dropout=config.hidden_dropout_prob,
    )


def classifier_dropout(config) -> float:
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


def bert_recipe(config) -> Recipe:
    dropout = classifier_dropout(config)
    return Recipe(
        stack=StackSpec(
            embeddings=EmbeddingSpec(
                vocab_size=config.vocab_size,
                hidden_size=config.hidden_size,
                padding_idx=config.pad_token_id,
                max_positions=config.max_position_embeddings,
                type_vocab_size=config.type_vocab_size,
                norm="layernorm",
                norm_eps=config.layer_norm_eps,
                dropout=config.hidden_dropout_prob,
            ),
            blocks=(bert_block(config, prenorm=False),) * config.num_hidden_layers,
            pooler=HeadSpec(pool="first", transform=TransformSpec("tanh")),
        ),
        heads={
            "masked_lm": HeadSpec(
                transform=TransformSpec(config.hidden_act, "layernorm", config.layer_norm_eps), at="lm_head.decoder"
            ),
            "next_sentence": HeadSpec(pool="pooler", at="nsp_head"),
            "sequence_classification": HeadSpec(pool="pooler", dropout=dropout, at="classifier"),
            "token_classification": HeadSpec(dropout=dropout, at="classifier"),
            "question_answering": HeadSpec(at="qa_outputs"),
            "multiple_choice": HeadSpec(pool="pooler", dropout=dropout, at="classifier"),
        },
    )


class FivefoldBertPreTrainedModel(EncoderPreTrainedModel):
    config: FivefoldBertConfig
    bert = stock_name_of_the_base()
    recipe = staticmethod(bert_recipe)
    _can_record_outputs = {**EncoderPreTrainedModel._can_record_outputs, **CROSS_ATTENTIONS_RECORD}


class FivefoldBertModel(FivefoldBertPreTrainedModel, EncoderModel):
    pass


class FivefoldBertForMaskedLM(FivefoldBertPreTrainedModel, EncoderForMaskedLM):
    base_model_class = FivefoldBertModel


class FivefoldBertForPreTraining(FivefoldBertPreTrainedModel, EncoderForPreTraining):
    base_model_class = FivefoldBertModel


class FivefoldBertForNextSentencePrediction(FivefoldBertPreTrainedModel, EncoderForNextSentencePrediction):
    base_model_class = FivefoldBertModel


class FivefoldBertForSequenceClassification(FivefoldBertPreTrainedModel, EncoderForSequenceClassification):
    base_model_class = FivefoldBertModel


class FivefoldBertForTokenClassification(FivefoldBertPreTrainedModel, EncoderForTokenClassification):
    base_model_class = FivefoldBertModel


class FivefoldBertForQuestionAnswering(FivefoldBertPreTrainedModel, EncoderForQuestionAnswering):
    base_model_class = FivefoldBertModel


class FivefoldBertForMultipleChoice(FivefoldBertPreTrainedModel, EncoderForMultipleChoice):
    base_model_class = FivefoldBertModel
