"""Public ModernBERT checkpoints (`model.` prefix on head models, none on `ModernBertModel`).

The fused projections are split: `Wqkv` holds [query, key, value]; `Wi` holds [input, gate] where stock computes
act(input) * gate, so its first half is our `gate_proj` (the activated one) and its second our `up_proj`.
"""

from .keymap import KeyMap, Rule, renames
from .samples import text_sample

MODERNBERT_BASE = [
    *renames(
        {
            "embeddings.tok_embeddings": "embeddings.word_embeddings",
            "embeddings.norm": "embeddings.norm",
            "layers.{}.attn_norm": "layers.{}.norm_before_attn",  # absent in layer 0
            "layers.{}.attn.Wo": "layers.{}.attn.o_proj",
            "layers.{}.mlp_norm": "layers.{}.norm_before_mlp",
            "layers.{}.mlp.Wo": "layers.{}.mlp.down_proj",
            "final_norm": "norm",
        }
    ),
    Rule(
        ("layers.{}.attn.Wqkv",),
        ("layers.{}.attn.q_proj", "layers.{}.attn.k_proj", "layers.{}.attn.v_proj"),
        "split3",
    ),
    Rule(("layers.{}.mlp.Wi",), ("layers.{}.mlp.gate_proj", "layers.{}.mlp.up_proj"), "split2"),
]

MODERNBERT_HEADS = {
    "head.dense": "head.dense",
    "head.norm": "head.norm",
    "decoder": "decoder",
    "classifier": "classifier",
}

MODERNBERT_KEYS = KeyMap(MODERNBERT_BASE, renames(MODERNBERT_HEADS))


def modernbert_sample(config, stock_class: str, seed: int = 0) -> dict:
    """`text_sample` without token types (ModernBERT has none); its rows are longer than the tiny sliding window."""
    inputs = text_sample(config, stock_class, seed)
    inputs.pop("token_type_ids")
    return inputs
