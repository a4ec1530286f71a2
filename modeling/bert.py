"""BERT: learned absolute positions and token types, post-norm blocks, GELU feed-forward.

The recipe maps the stock `BertConfig` fields onto shared parts; the classes below are one-line wirings.
"""

from ..configuration.bert import FivefoldBertConfig
from .bert_style import bert_style_block
from .embeddings import EmbeddingSpec
from .encoder import EncoderModel, EncoderPreTrainedModel, EncoderRecipe
from .encoder_heads import (
    EncoderForMaskedLM,
    EncoderForMultipleChoice,
    EncoderForNextSentencePrediction,
    EncoderForPreTraining,
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)


def bert_recipe(config) -> EncoderRecipe:
    classifier_dropout = (
        config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    )
    block = bert_style_block(config, prenorm=False)
    return EncoderRecipe(
        embeddings=EmbeddingSpec(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            pad_token_id=config.pad_token_id,
            max_positions=config.max_position_embeddings,
            type_vocab_size=config.type_vocab_size,
            norm="layernorm",
            norm_eps=config.layer_norm_eps,
            dropout=config.hidden_dropout_prob,
        ),
        blocks=(block,) * config.num_hidden_layers,
        final_norm="none",
        norm_eps=config.layer_norm_eps,
        lm_head_act=config.hidden_act,
        lm_head_norm="layernorm",
        sequence_classifier="pooled",
        classifier_dropout=classifier_dropout,
        multiple_choice_dropout=classifier_dropout,
    )


class FivefoldBertPreTrainedModel(EncoderPreTrainedModel):
    config: FivefoldBertConfig
    recipe = staticmethod(bert_recipe)


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
