"""Public BERT checkpoints (`bert.` prefix on head models, none on `BertModel` and in legacy files)."""

from fivefold.configuration.bert import FivefoldBertConfig
from fivefold.modeling import bert as modeling

from .architecture import Architecture
from .inputs import text_sample
from .keymap import KeyMap, Rule, legacy_norm_names, renames

# The encoder layout shared by BERT and RoBERTa: stock name under `bert.`/`roberta.` -> ours under `model.`.
ENCODER_BASE = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
    "embeddings.LayerNorm": "embeddings.norm",
    "embeddings.position_ids": None,  # a buffer of 0..n-1 that old files stored
    "embeddings.token_type_ids": None,  # likewise a zeros buffer
    "encoder.layer.{}.attention.self.query": "layers.{}.attn.q_proj",
    "encoder.layer.{}.attention.self.key": "layers.{}.attn.k_proj",
    "encoder.layer.{}.attention.self.value": "layers.{}.attn.v_proj",
    "encoder.layer.{}.attention.output.dense": "layers.{}.attn.o_proj",
    "encoder.layer.{}.attention.output.LayerNorm": "layers.{}.norm_after_attn",
    "encoder.layer.{}.intermediate.dense": "layers.{}.mlp.up_proj",
    "encoder.layer.{}.output.dense": "layers.{}.mlp.down_proj",
    "encoder.layer.{}.output.LayerNorm": "layers.{}.norm_after_mlp",
    "pooler.dense": "pooler.dense",
}

BERT_HEADS = {
    "cls.predictions.transform.dense": "lm_head.dense",
    "cls.predictions.transform.LayerNorm": "lm_head.norm",
    "cls.predictions.decoder.weight": "lm_head.decoder.weight",
    "cls.seq_relationship": "nsp_head",
    "classifier": "classifier",
    "qa_outputs": "qa_outputs",
}


def mlm_bias_rules(bias: str, decoder_bias: str, tied: bool) -> list[Rule]:
    """The MLM head's bias, which stock keeps under two names: one tensor while the head is tied (saved as `bias`),
    two once it is untied (both saved), and stock's model reads the decoder's. Read: the decoder's where the file
    holds it, else the other. Written as stock 5 saves it, under `bias` while tied, `decoder.bias` once untied."""
    ours = ("lm_head.decoder.bias",)
    return [Rule((bias,), ours, fallback=True, import_only=not tied), Rule((decoder_bias,), ours, import_only=tied)]


def bert_keys(config) -> KeyMap:
    bias = mlm_bias_rules("cls.predictions.bias", "cls.predictions.decoder.bias", config.tie_word_embeddings)
    return KeyMap(renames(ENCODER_BASE), [*renames(BERT_HEADS), *bias], legacy=legacy_norm_names)


# A tiny stock config for the demo and tests (vocab 99, hidden 32, 2 layers, intermediate 37).
TINY_TEXT_ENCODER = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=64, type_vocab_size=2,
)  # fmt: skip

# google-bert/bert-base-uncased's config.json: the fields that set its shapes.
BERT_BASE_UNCASED = dict(
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
    type_vocab_size=2,
    pad_token_id=0,
    hidden_act="gelu",
    layer_norm_eps=1e-12,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="bert",
    stock_prefix="bert",
    config_class=FivefoldBertConfig,
    models={
        "AutoModel": modeling.FivefoldBertModel,
        "AutoModelForMaskedLM": modeling.FivefoldBertForMaskedLM,
        "AutoModelForPreTraining": modeling.FivefoldBertForPreTraining,
        "AutoModelForNextSentencePrediction": modeling.FivefoldBertForNextSentencePrediction,
        "AutoModelForSequenceClassification": modeling.FivefoldBertForSequenceClassification,
        "AutoModelForTokenClassification": modeling.FivefoldBertForTokenClassification,
        "AutoModelForQuestionAnswering": modeling.FivefoldBertForQuestionAnswering,
        "AutoModelForMultipleChoice": modeling.FivefoldBertForMultipleChoice,
    },
    keys=bert_keys,
    tiny=TINY_TEXT_ENCODER,
    public={"google-bert/bert-base-uncased": BERT_BASE_UNCASED},
    sample_inputs=text_sample,
)
