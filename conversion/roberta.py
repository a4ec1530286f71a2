"""Public RoBERTa checkpoints: BERT's encoder layout under `roberta.`, with RoBERTa's own heads."""

from .bert import ENCODER_BASE
from .keymap import KeyMap, legacy_norm_names, renames

ROBERTA_HEADS = {
    "lm_head.dense": "lm_head.dense",
    "lm_head.layer_norm": "lm_head.norm",
    "lm_head.bias": "lm_head.decoder.bias",
    "lm_head.decoder.weight": "lm_head.decoder.weight",
    "lm_head.decoder.bias": "lm_head.decoder.bias",  # the same tensor as lm_head.bias
    "classifier": "classifier",  # classifier.dense / classifier.out_proj, or a single linear layer
    "qa_outputs": "qa_outputs",
}

ROBERTA_KEYS = KeyMap(renames(ENCODER_BASE), renames(ROBERTA_HEADS), legacy=legacy_norm_names)
