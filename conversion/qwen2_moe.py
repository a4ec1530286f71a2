"""Public Qwen2-MoE checkpoints (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): per-expert tensors, the Hub's layout, or the
fused 3-D experts of a stock model saved with `save_original_format=False`; both convert (key map: experts.py),
with the shared expert and its gate."""

from fivefold.configuration.qwen2_moe import FivefoldQwen2MoeConfig
from fivefold.modeling import qwen2_moe as modeling

from .architecture import Architecture
from .experts import qwen_style_moe_keys
from .inputs import causal_text_sample
from .llama import llama_like_models

# Four experts, two per token, beside a shared expert; every second layer sparse (`decoder_sparse_step`), so the
# first is dense. Expert widths are multiples of 16 bytes, as stock's default `grouped_mm` experts need on CPU.
TINY_QWEN2_MOE = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=40, moe_intermediate_size=24, shared_expert_intermediate_size=48, num_experts=4,
    num_experts_per_tok=2, decoder_sparse_step=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
    eos_token_id=2,
)  # fmt: skip

# Qwen/Qwen1.5-MoE-A2.7B's config.json: the fields that set its shapes.
QWEN15_MOE_A27B = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
    num_experts=60, num_experts_per_tok=4, norm_topk_prob=False, decoder_sparse_step=1,
    max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
    bos_token_id=151643, eos_token_id=151643,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="qwen2_moe",
    stock_prefix="model",
    config_class=FivefoldQwen2MoeConfig,
    models=llama_like_models(modeling, "Qwen2Moe"),
    keys=qwen_style_moe_keys,
    tiny=TINY_QWEN2_MOE,
    public={"Qwen/Qwen1.5-MoE-A2.7B": QWEN15_MOE_A27B},
    sample_inputs=causal_text_sample,
)
