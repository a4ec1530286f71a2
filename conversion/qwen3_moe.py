"""Public Qwen3-MoE checkpoints (Qwen3-30B-A3B, Qwen3-235B-A22B, the Coder variants): per-expert tensors, the
Hub's layout, or the fused 3-D experts of a stock model saved with `save_original_format=False`; both convert
(key map: experts.py). Stock's question-answering class keeps its base model under `transformer.`."""

from fivefold.configuration.qwen3_moe import FivefoldQwen3MoeConfig
from fivefold.modeling import qwen3_moe as modeling

from .architecture import Architecture
from .experts import qwen_style_moe_keys
from .inputs import causal_text_sample
from .llama import llama_like_models

# Four experts, two per token, the second layer dense (`mlp_only_layers`), a head width (16) other than
# hidden / heads (8), as Qwen3-30B-A3B has. Expert widths are multiples of 16 bytes, as stock's default
# `grouped_mm` experts need on CPU.
TINY_QWEN3_MOE = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=40, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
    mlp_only_layers=[1], max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip

# Qwen/Qwen3-30B-A3B's config.json: the fields that set its shapes.
QWEN3_30B_A3B = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
    rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="qwen3_moe",
    stock_prefix="model",
    config_class=FivefoldQwen3MoeConfig,
    models=llama_like_models(modeling, "Qwen3Moe"),
    keys=qwen_style_moe_keys,
    tiny=TINY_QWEN3_MOE,
    public={"Qwen/Qwen3-30B-A3B": QWEN3_30B_A3B},
    sample_inputs=causal_text_sample,
    stock_prefixes={"Qwen3MoeForQuestionAnswering": "transformer"},
)
