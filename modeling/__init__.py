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
from .gpt2 import (
    FivefoldGPT2ForSequenceClassification,
    FivefoldGPT2ForTokenClassification,
    FivefoldGPT2LMHeadModel,
    FivefoldGPT2Model,
    FivefoldGPT2PreTrainedModel,
)
from .mixtral import (
    FivefoldMixtralForCausalLM,
    FivefoldMixtralForSequenceClassification,
    FivefoldMixtralModel,
    FivefoldMixtralPreTrainedModel,
)
from .modernbert import (
    FivefoldModernBertForMaskedLM,
    FivefoldModernBertForMultipleChoice,
    FivefoldModernBertForQuestionAnswering,
    FivefoldModernBertForSequenceClassification,
    FivefoldModernBertForTokenClassification,
    FivefoldModernBertModel,
    FivefoldModernBertPreTrainedModel,
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
from .vit import FivefoldViTForImageClassification, FivefoldViTModel, FivefoldViTPreTrainedModel

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
    "FivefoldGPT2ForSequenceClassification",
    "FivefoldGPT2ForTokenClassification",
    "FivefoldGPT2LMHeadModel",
    "FivefoldGPT2Model",
    "FivefoldGPT2PreTrainedModel",
    "FivefoldMixtralForCausalLM",
    "FivefoldMixtralForSequenceClassification",
    "FivefoldMixtralModel",
    "FivefoldMixtralPreTrainedModel",
    "FivefoldModernBertForMaskedLM",
    "FivefoldModernBertForMultipleChoice",
    "FivefoldModernBertForQuestionAnswering",
    "FivefoldModernBertForSequenceClassification",
    "FivefoldModernBertForTokenClassification",
    "FivefoldModernBertModel",
    "FivefoldModernBertPreTrainedModel",
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
    "FivefoldViTForImageClassification",
    "FivefoldViTModel",
    "FivefoldViTPreTrainedModel",
]
