"""Models: one shared block and its parts, and a thin recipe per architecture."""

from .bert import (
    FivefoldBertForMaskedLM,
    FivefoldBertForMultipleChoice,
    FivefoldBertForNextSentencePrediction,
    FivefoldBertForPreTraining,
    FivefoldBertForQuestionAnswering,
    FivefoldBertForSequenceClassification,
    FivefoldBertForTokenClassification,
    FivefoldBertModel,
    FivefoldBertPreTrainedModel,
)
from .roberta import (
    FivefoldRobertaForMaskedLM,
    FivefoldRobertaForMultipleChoice,
    FivefoldRobertaForQuestionAnswering,
    FivefoldRobertaForSequenceClassification,
    FivefoldRobertaForTokenClassification,
    FivefoldRobertaModel,
    FivefoldRobertaPreTrainedModel,
)
from .t5 import (
    FivefoldT5EncoderModel,
    FivefoldT5ForConditionalGeneration,
    FivefoldT5Model,
    FivefoldT5PreTrainedModel,
)

__all__ = [
    "FivefoldBertForMaskedLM",
    "FivefoldBertForMultipleChoice",
    "FivefoldBertForNextSentencePrediction",
    "FivefoldBertForPreTraining",
    "FivefoldBertForQuestionAnswering",
    "FivefoldBertForSequenceClassification",
    "FivefoldBertForTokenClassification",
    "FivefoldBertModel",
    "FivefoldBertPreTrainedModel",
    "FivefoldRobertaForMaskedLM",
    "FivefoldRobertaForMultipleChoice",
    "FivefoldRobertaForQuestionAnswering",
    "FivefoldRobertaForSequenceClassification",
    "FivefoldRobertaForTokenClassification",
    "FivefoldRobertaModel",
    "FivefoldRobertaPreTrainedModel",
    "FivefoldT5EncoderModel",
    "FivefoldT5ForConditionalGeneration",
    "FivefoldT5Model",
    "FivefoldT5PreTrainedModel",
]
