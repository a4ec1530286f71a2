"""The table of architectures: for each, its config, the model class behind every Auto class, and the key map
from the public checkpoint layout."""

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PretrainedConfig, PreTrainedModel

from fivefold.configuration import (
    FivefoldBertConfig,
    FivefoldGPT2Config,
    FivefoldMixtralConfig,
    FivefoldModernBertConfig,
    FivefoldRobertaConfig,
    FivefoldT5Config,
    FivefoldViTConfig,
)
from fivefold.conversion.bert import BERT_KEYS
from fivefold.conversion.gpt2 import GPT2_KEYS
from fivefold.conversion.keymap import KeyMap
from fivefold.conversion.mixtral import MIXTRAL_KEYS
from fivefold.conversion.modernbert import MODERNBERT_KEYS, modernbert_sample
from fivefold.conversion.roberta import ROBERTA_KEYS
from fivefold.conversion.samples import causal_text_sample, image_sample, text_sample
from fivefold.conversion.t5 import T5_KEYS, t5_sample
from fivefold.conversion.vit import VIT_KEYS
from fivefold.modeling import bert, gpt2, mixtral, modernbert, roberta, t5, vit


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

# Three layers (global, local, global) in the public checkpoints' legacy form, a local window of 4 positions (the
# sample rows are longer), distinct rotary bases.
TINY_MODERNBERT = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=4, global_rope_theta=10000.0,
    local_rope_theta=100.0, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
)  # fmt: skip

# 32 x 32 images in 8 x 8 patches: 16 patch tokens and [CLS].
TINY_VIT = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=32, patch_size=8,
    num_channels=3,
)  # fmt: skip

# Special ids below the random tokens of the samples, so that no real token reads as padding or the end.
TINY_GPT2 = dict(
    vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_inner=37, n_positions=64,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip

# Four experts, two per token; two key/value heads for four query heads (grouped-query attention). The expert
# width is 40, not 37: stock's default `grouped_mm` experts on CPU need rows that are multiples of 16 bytes.
TINY_MIXTRAL = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=40, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
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
        stock_model_type="modernbert",
        stock_prefix="model",
        config_class=FivefoldModernBertConfig,
        models={
            "AutoModel": modernbert.FivefoldModernBertModel,
            "AutoModelForMaskedLM": modernbert.FivefoldModernBertForMaskedLM,
            "AutoModelForSequenceClassification": modernbert.FivefoldModernBertForSequenceClassification,
            "AutoModelForTokenClassification": modernbert.FivefoldModernBertForTokenClassification,
            "AutoModelForQuestionAnswering": modernbert.FivefoldModernBertForQuestionAnswering,
            "AutoModelForMultipleChoice": modernbert.FivefoldModernBertForMultipleChoice,
        },
        keys=MODERNBERT_KEYS,
        tiny=TINY_MODERNBERT,
        sample_inputs=modernbert_sample,
    ),
    Architecture(
        stock_model_type="vit",
        stock_prefix="vit",
        config_class=FivefoldViTConfig,
        models={
            "AutoModel": vit.FivefoldViTModel,
            "AutoModelForImageClassification": vit.FivefoldViTForImageClassification,
        },
        keys=VIT_KEYS,
        tiny=TINY_VIT,
        sample_inputs=image_sample,
    ),
    Architecture(
        stock_model_type="gpt2",
        stock_prefix="transformer",
        config_class=FivefoldGPT2Config,
        models={
            "AutoModel": gpt2.FivefoldGPT2Model,
            "AutoModelForCausalLM": gpt2.FivefoldGPT2LMHeadModel,
            "AutoModelForSequenceClassification": gpt2.FivefoldGPT2ForSequenceClassification,
            "AutoModelForTokenClassification": gpt2.FivefoldGPT2ForTokenClassification,
        },
        keys=GPT2_KEYS,
        tiny=TINY_GPT2,
        sample_inputs=causal_text_sample,
    ),
    Architecture(
        stock_model_type="mixtral",
        stock_prefix="model",
        config_class=FivefoldMixtralConfig,
        models={
            "AutoModel": mixtral.FivefoldMixtralModel,
            "AutoModelForCausalLM": mixtral.FivefoldMixtralForCausalLM,
            "AutoModelForSequenceClassification": mixtral.FivefoldMixtralForSequenceClassification,
        },
        keys=MIXTRAL_KEYS,
        tiny=TINY_MIXTRAL,
        sample_inputs=causal_text_sample,
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
