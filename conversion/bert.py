"""Public BERT checkpoints (`bert.` prefix on head models, none on `BertModel` and in legacy files)."""

from .keymap import KeyMap, legacy_norm_names, renames

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
    "cls.predictions.bias": "lm_head.decoder.bias",
    "cls.predictions.decoder.weight": "lm_head.decoder.weight",
    "cls.predictions.decoder.bias": "lm_head.decoder.bias",  # the same tensor as cls.predictions.bias
    "cls.seq_relationship": "nsp_head",
    "classifier": "classifier",
    "qa_outputs": "qa_outputs",
}

BERT_KEYS = KeyMap(renames(ENCODER_BASE), renames(BERT_HEADS), legacy=legacy_norm_names)
