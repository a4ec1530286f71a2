"""RoBERTa: BERT's blocks, with positions numbered after the padding index, a GELU masked-LM head and a
first-token classification head."""

import dataclasses

from ..configuration.roberta import FivefoldRobertaConfig
from .bert import bert_recipe
from .encoder import EncoderModel, EncoderPreTrainedModel, EncoderRecipe
from .encoder_heads import (
    EncoderForMaskedLM,
    EncoderForMultipleChoice,
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)


def roberta_recipe(config) -> EncoderRecipe:
    bert = bert_recipe(config)
    return dataclasses.replace(
        bert,
        embeddings=dataclasses.replace(bert.embeddings, positions_after_padding=True),
        lm_head_act="gelu",
        sequence_classifier="first_token",
        multiple_choice_dropout=config.hidden_dropout_prob,  # stock RoBERTa ignores classifier_dropout here
    )


class FivefoldRobertaPreTrainedModel(EncoderPreTrainedModel):
    config: FivefoldRobertaConfig
    recipe = staticmethod(roberta_recipe)


class FivefoldRobertaModel(FivefoldRobertaPreTrainedModel, EncoderModel):
    pass


class FivefoldRobertaForMaskedLM(FivefoldRobertaPreTrainedModel, EncoderForMaskedLM):
    base_model_class = FivefoldRobertaModel


class FivefoldRobertaForSequenceClassification(FivefoldRobertaPreTrainedModel, EncoderForSequenceClassification):
    base_model_class = FivefoldRobertaModel


class FivefoldRobertaForTokenClassification(FivefoldRobertaPreTrainedModel, EncoderForTokenClassification):
    base_model_class = FivefoldRobertaModel


class FivefoldRobertaForQuestionAnswering(FivefoldRobertaPreTrainedModel, EncoderForQuestionAnswering):
    base_model_class = FivefoldRobertaModel


class FivefoldRobertaForMultipleChoice(FivefoldRobertaPreTrainedModel, EncoderForMultipleChoice):
    base_model_class = FivefoldRobertaModel
