"""Public RoBERTa checkpoints: BERT's encoder layout under `roberta.`, with RoBERTa's own heads."""

from fivefold.configuration.roberta import FivefoldRobertaConfig
from fivefold.modeling import roberta as modeling

from .architecture import Architecture
from .bert import ENCODER_BASE, TINY_TEXT_ENCODER, mlm_bias_rules
from .inputs import text_sample
from .keymap import KeyMap, legacy_norm_names, renames

ROBERTA_HEADS = {
    "lm_head.dense": "lm_head.dense",
    "lm_head.layer_norm": "lm_head.norm",
    "lm_head.decoder.weight": "lm_head.decoder.weight",
    "classifier": "classifier",  # classifier.dense / classifier.out_proj, or a single linear layer
    "qa_outputs": "qa_outputs",
}


def roberta_keys(config) -> KeyMap:
    bias = mlm_bias_rules("lm_head.bias", "lm_head.decoder.bias", config.tie_word_embeddings)
    return KeyMap(renames(ENCODER_BASE), [*renames(ROBERTA_HEADS), *bias], legacy=legacy_norm_names)


# FacebookAI/roberta-base's config.json: the fields that set its shapes.
ROBERTA_BASE = dict(
    vocab_size=50265,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=514,
    type_vocab_size=1,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    layer_norm_eps=1e-5,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="roberta",
    stock_prefix="roberta",
    config_class=FivefoldRobertaConfig,
    models={
        "AutoModel": modeling.FivefoldRobertaModel,
        "AutoModelForMaskedLM": modeling.FivefoldRobertaForMaskedLM,
        "AutoModelForSequenceClassification": modeling.FivefoldRobertaForSequenceClassification,
        "AutoModelForTokenClassification": modeling.FivefoldRobertaForTokenClassification,
        "AutoModelForQuestionAnswering": modeling.FivefoldRobertaForQuestionAnswering,
        "AutoModelForMultipleChoice": modeling.FivefoldRobertaForMultipleChoice,
    },
    keys=roberta_keys,
    tiny={**TINY_TEXT_ENCODER, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
    public={"FacebookAI/roberta-base": ROBERTA_BASE},
    sample_inputs=text_sample,
)
