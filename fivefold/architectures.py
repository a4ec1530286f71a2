"""The table of architectures: for each, its config, the model class behind every Auto class, and the key map
from the public checkpoint layout."""

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PretrainedConfig, PreTrainedModel

from fivefold.configuration import FivefoldBertConfig, FivefoldRobertaConfig, FivefoldT5Config
from fivefold.conversion.bert import BERT_KEYS
from fivefold.conversion.keymap import KeyMap
from fivefold.conversion.roberta import ROBERTA_KEYS
from fivefold.conversion.samples import text_sample
from fivefold.conversion.t5 import T5_KEYS, t5_sample
from fivefold.modeling import bert, roberta, t5


@dataclass(frozen=True)
class Architecture:
    stock_model_type: str  # model_type of the public checkpoints
    stock_prefix: str  # base_model_prefix of the stock head classes
    config_class: type[PretrainedConfig]
    models: dict[str, type[PreTrainedModel]]  # transformers Auto class name -> our class
    keys: KeyMap
    # A tiny stock config for the demo and tests (vocab 99, hidden 32, 2 layers, intermediate 37).
    tiny: dict
    # (stock config, stock class name, seed) -> a batch for that class, used by `verify`, `demo` and tests.
    sample_inputs: Callable[..., dict] = text_sample

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def base_model(self) -> type[PreTrainedModel]:
        return self.models["AutoModel"]

    def class_named(self, name: str) -> type[PreTrainedModel]:
        """Our class for a stock class name (`BertForMaskedLM`) or one of ours (`FivefoldBertForMaskedLM`)."""
        for cls in self.models.values():
            if name in (cls.__name__, stock_class_name(cls)):
                return cls
        valid = ", ".join(stock_class_name(c) for c in self.models.values())
        raise KeyError(f"{name!r} is not supported for {self.stock_model_type}; supported: {valid}")


def stock_class_name(cls: type) -> str:
    return cls.__name__.removeprefix("Fivefold")


TINY_TEXT_ENCODER = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=64, type_vocab_size=2,
)  # fmt: skip

# Unequal depths, few buckets and a short max distance, so that every bucket range is exercised.
TINY_T5 = dict(
    vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=3, num_heads=4,
    relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
)  # fmt: skip

ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(
        stock_model_type="bert",
        stock_prefix="bert",
        config_class=FivefoldBertConfig,
        models={
            "AutoModel": bert.FivefoldBertModel,
            "AutoModelForMaskedLM": bert.FivefoldBertForMaskedLM,
            "AutoModelForPreTraining": bert.FivefoldBertForPreTraining,
            "AutoModelForNextSentencePrediction": bert.FivefoldBertForNextSentencePrediction,
            "AutoModelForSequenceClassification": bert.FivefoldBertForSequenceClassification,
            "AutoModelForTokenClassification": bert.FivefoldBertForTokenClassification,
            "AutoModelForQuestionAnswering": bert.FivefoldBertForQuestionAnswering,
            "AutoModelForMultipleChoice": bert.FivefoldBertForMultipleChoice,
        },
        keys=BERT_KEYS,
        tiny=TINY_TEXT_ENCODER,
    ),
    Architecture(
        stock_model_type="roberta",
        stock_prefix="roberta",
        config_class=FivefoldRobertaConfig,
        models={
            "AutoModel": roberta.FivefoldRobertaModel,
            "AutoModelForMaskedLM": roberta.FivefoldRobertaForMaskedLM,
            "AutoModelForSequenceClassification": roberta.FivefoldRobertaForSequenceClassification,
            "AutoModelForTokenClassification": roberta.FivefoldRobertaForTokenClassification,
            "AutoModelForQuestionAnswering": roberta.FivefoldRobertaForQuestionAnswering,
            "AutoModelForMultipleChoice": roberta.FivefoldRobertaForMultipleChoice,
        },
        keys=ROBERTA_KEYS,
        tiny={**TINY_TEXT_ENCODER, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
    ),
    Architecture(
        stock_model_type="t5",
        stock_prefix="",  # public T5 files have no prefix
        config_class=FivefoldT5Config,
        models={
            "AutoModel": t5.FivefoldT5Model,
            "AutoModelForSeq2SeqLM": t5.FivefoldT5ForConditionalGeneration,
            "AutoModelForTextEncoding": t5.FivefoldT5EncoderModel,
        },
        keys=T5_KEYS,
        tiny=TINY_T5,
        sample_inputs=t5_sample,
    ),
)


def architecture_for_config(config_class: type) -> Architecture:
    for arch in ARCHITECTURES:
        if arch.config_class.__name__ == config_class.__name__:
            return arch
    raise KeyError(f"{config_class.__name__} is not a fivefold config")


def architecture_for_model_type(model_type: str | None) -> Architecture:
    """By stock (`bert`) or fivefold (`fivefold_bert`) model_type."""
    for arch in ARCHITECTURES:
        if model_type in (arch.stock_model_type, arch.model_type):
            return arch
    valid = ", ".join(a.stock_model_type for a in ARCHITECTURES)
    raise KeyError(f"unsupported model_type {model_type!r}; fivefold converts: {valid}")
