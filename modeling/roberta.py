"""RoBERTa: BERT's blocks, with positions numbered after the padding index, a GELU masked-LM head and a
classifier on the first token (dropout -> dense -> tanh -> dropout -> out_proj)."""

import dataclasses

from ..configuration.roberta import FivefoldRobertaConfig
from .attention import CROSS_ATTENTIONS_RECORD
from .bert import bert_recipe, classifier_dropout
from .encoder import EncoderModel, EncoderPreTrainedModel
from .encoder_tasks import (
    EncoderForMaskedLM,
    EncoderForMultipleChoice,
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from .heads import HeadSpec, TransformSpec
from .stack import Recipe
from .tasks import stock_name_of_the_base


def roberta_recipe(config) -> Recipe:
    bert = bert_recipe(config)
    dropout = classifier_dropout(config)
    masked_lm = bert.heads["masked_lm"]
    gelu = dataclasses.replace(masked_lm.transform, activation="gelu")
    return dataclasses.replace(
        bert,
        stack=dataclasses.replace(
            bert.stack, embeddings=dataclasses.replace(bert.stack.embeddings, positions_after_padding=True)
        ),
        heads={
            **bert.heads,
            "masked_lm": dataclasses.replace(masked_lm, transform=gelu),
            "sequence_classification": HeadSpec(
                pool="first",
                input_dropout=dropout,
                transform=TransformSpec("tanh"),
                dropout=dropout,
                at="classifier.out_proj",
            ),
            # Stock RoBERTa's multiple-choice head ignores classifier_dropout.
            "multiple_choice": HeadSpec(pool="pooler", dropout=config.hidden_dropout_prob, at="classifier"),
        },
    )


class FivefoldRobertaPreTrainedModel(EncoderPreTrainedModel):
    config: FivefoldRobertaConfig
    roberta = stock_name_of_the_base()
    recipe = staticmethod(roberta_recipe)
    _can_record_outputs = {**EncoderPreTrainedModel._can_record_outputs, **CROSS_ATTENTIONS_RECORD}


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
