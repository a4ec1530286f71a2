"""Public Llama checkpoints (`model.` prefix on head models, `transformer.` on LlamaForQuestionAnswering), and
the key map every Llama-like decoder shares: one tensor per projection, as fivefold holds them, so conversion is
a plain rename. Qwen3's per-head query/key norms are `self_attn.q_norm`/`k_norm`."""

from types import ModuleType

from fivefold.configuration.llama import FivefoldLlamaConfig
from fivefold.modeling import llama as modeling

from .architecture import Architecture
from .inputs import causal_text_sample
from .keymap import KeyMap, renames

# Everything but the feed-forward: the mixtures of experts built on the Llama layout (Mixtral, Qwen-MoE) add
# their own expert rules to these.
LLAMA_ATTENTION = {
    "embed_tokens": "embeddings.word_embeddings",
    "layers.{}.input_layernorm": "layers.{}.norm_before_attn",
    "layers.{}.self_attn.q_proj": "layers.{}.attn.q_proj",
    "layers.{}.self_attn.k_proj": "layers.{}.attn.k_proj",
    "layers.{}.self_attn.v_proj": "layers.{}.attn.v_proj",
    "layers.{}.self_attn.o_proj": "layers.{}.attn.o_proj",
    "layers.{}.self_attn.q_norm": "layers.{}.attn.q_norm",
    "layers.{}.self_attn.k_norm": "layers.{}.attn.k_norm",
    "layers.{}.post_attention_layernorm": "layers.{}.norm_before_mlp",
    "norm": "norm",
    # The rotary frequencies as a stored buffer (files written before transformers stopped saving it): recomputed.
    "layers.{}.self_attn.rotary_emb": None,
}
LLAMA_BASE = {
    **LLAMA_ATTENTION,
    "layers.{}.mlp.gate_proj": "layers.{}.mlp.gate_proj",
    "layers.{}.mlp.up_proj": "layers.{}.mlp.up_proj",
    "layers.{}.mlp.down_proj": "layers.{}.mlp.down_proj",
}
LLAMA_HEADS = {"lm_head": "lm_head", "score": "score", "qa_outputs": "qa_outputs"}
LLAMA_KEYS = KeyMap(renames(LLAMA_BASE), renames(LLAMA_HEADS))


def llama_like_models(module: ModuleType, name: str) -> dict[str, type]:
    """Auto class -> the class of a Llama-like architecture's modeling module (`name`: "Llama", "Qwen2", ...)."""
    return {
        "AutoModel": getattr(module, f"Fivefold{name}Model"),
        "AutoModelForCausalLM": getattr(module, f"Fivefold{name}ForCausalLM"),
        "AutoModelForSequenceClassification": getattr(module, f"Fivefold{name}ForSequenceClassification"),
        "AutoModelForTokenClassification": getattr(module, f"Fivefold{name}ForTokenClassification"),
        "AutoModelForQuestionAnswering": getattr(module, f"Fivefold{name}ForQuestionAnswering"),
    }


# Two key/value heads for four query heads (grouped-query attention); special ids below the samples' tokens.
TINY_LLAMA_LIKE = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=37, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip

# meta-llama/Llama-3.1-8B's and Llama-3.2-1B's config.json: the fields that set their shapes and rotary tables.
LLAMA_3_ROPE = dict(
    low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192, rope_type="llama3"
)
LLAMA_3_1_8B = dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling=dict(factor=8.0, **LLAMA_3_ROPE), tie_word_embeddings=False, bos_token_id=128000,
    eos_token_id=128001,
)  # fmt: skip
LLAMA_3_2_1B = dict(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling=dict(factor=32.0, **LLAMA_3_ROPE), tie_word_embeddings=True, bos_token_id=128000,
    eos_token_id=128001,
)  # fmt: skip

# HuggingFaceTB/SmolLM2-135M-Instruct's config.json (the real weights of tests/test_real_weights.py and
# benchmarks/decoders.py): a Llama of 9 query and 3 key/value heads, tied embeddings.
SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="llama",
    stock_prefix="model",
    stock_prefixes={"LlamaForQuestionAnswering": "transformer"},
    config_class=FivefoldLlamaConfig,
    models=llama_like_models(modeling, "Llama"),
    keys=lambda config: LLAMA_KEYS,
    tiny=TINY_LLAMA_LIKE,
    public={
        "meta-llama/Llama-3.1-8B": LLAMA_3_1_8B,
        "meta-llama/Llama-3.2-1B": LLAMA_3_2_1B,
        "HuggingFaceTB/SmolLM2-135M-Instruct": SMOLLM2_135M,
    },
    sample_inputs=causal_text_sample,
)
