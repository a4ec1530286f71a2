"""Public OLMoE checkpoints (OLMoE-1B-7B-0924 and its Instruct variant): per-expert tensors, the Hub's layout, or
the fused 3-D experts of a stock model saved with `save_original_format=False`; both convert (key map:
experts.py), with the q/k norms across the full projection width."""

from fivefold.configuration.olmoe import FivefoldOlmoeConfig
from fivefold.modeling import olmoe as modeling

from .architecture import Architecture
from .experts import qwen_style_moe_keys
from .inputs import causal_text_sample

# Four experts, two per token; expert width 24, a multiple of 16 bytes, as stock's default `grouped_mm` experts
# need on CPU.
TINY_OLMOE = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=24, num_experts=4, num_experts_per_tok=2, max_position_embeddings=64, pad_token_id=0,
    bos_token_id=1, eos_token_id=2,
)  # fmt: skip

# allenai/OLMoE-1B-7B-0924's config.json: the fields that set its shapes.
OLMOE_1B_7B = dict(
    vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
    num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
    max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, clip_qkv=None, tie_word_embeddings=False,
    pad_token_id=1, bos_token_id=None, eos_token_id=50279,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="olmoe",
    stock_prefix="model",
    config_class=FivefoldOlmoeConfig,
    models={
        "AutoModel": modeling.FivefoldOlmoeModel,
        "AutoModelForCausalLM": modeling.FivefoldOlmoeForCausalLM,
    },
    keys=qwen_style_moe_keys,
    tiny=TINY_OLMOE,
    public={"allenai/OLMoE-1B-7B-0924": OLMOE_1B_7B},
    sample_inputs=causal_text_sample,
)
