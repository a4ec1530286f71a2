"""Public ModernBERT checkpoints (`model.` prefix on head models, none on `ModernBertModel`).

The fused projections are split: `Wqkv` holds [query, key, value]; `Wi` holds [input, gate] where stock computes
act(input) * gate, so its first half is our `gate_proj` (the activated one) and its second our `up_proj`.
"""

from fivefold.configuration.modernbert import FivefoldModernBertConfig
from fivefold.modeling import modernbert as modeling

from .architecture import Architecture
from .inputs import text_sample_without_token_types
from .keymap import KeyMap, Rule, renames

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


# Three layers (global, local, global) in the public checkpoints' legacy form, a local window of 4 positions (the
# sample rows are longer), distinct rotary bases.
TINY_MODERNBERT = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=4, global_rope_theta=10000.0,
    local_rope_theta=100.0, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
)  # fmt: skip

# answerdotai/ModernBERT-base's config.json: the fields that set its shapes.
MODERNBERT_BASE = dict(
    vocab_size=50368,
    hidden_size=768,
    num_hidden_layers=22,
    num_attention_heads=12,
    intermediate_size=1152,
    max_position_embeddings=8192,
    global_attn_every_n_layers=3,
    local_attention=128,
    global_rope_theta=160000.0,
    local_rope_theta=10000.0,
    pad_token_id=50283,
    norm_bias=False,
    attention_bias=False,
    mlp_bias=False,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="modernbert",
    stock_prefix="model",
    config_class=FivefoldModernBertConfig,
    models={
        "AutoModel": modeling.FivefoldModernBertModel,
        "AutoModelForMaskedLM": modeling.FivefoldModernBertForMaskedLM,
        "AutoModelForSequenceClassification": modeling.FivefoldModernBertForSequenceClassification,
        "AutoModelForTokenClassification": modeling.FivefoldModernBertForTokenClassification,
        "AutoModelForQuestionAnswering": modeling.FivefoldModernBertForQuestionAnswering,
        "AutoModelForMultipleChoice": modeling.FivefoldModernBertForMultipleChoice,
    },
    keys=lambda config: MODERNBERT_KEYS,
    tiny=TINY_MODERNBERT,
    public={"answerdotai/ModernBERT-base": MODERNBERT_BASE},
    sample_inputs=text_sample_without_token_types,  # its rows are longer than the tiny window
    lora_targets=("q_proj", "k_proj", "v_proj"),  # stock fuses them (Wqkv), which PEFT has no default for
)
