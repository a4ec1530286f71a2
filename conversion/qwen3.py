"""Public Qwen3 checkpoints: the Llama layout (conversion/llama.py) with per-head query/key norms, `model.` prefix
on head models, `transformer.` on Qwen3ForQuestionAnswering."""

from fivefold.configuration.qwen3 import FivefoldQwen3Config
from fivefold.modeling import qwen3 as modeling

from .architecture import Architecture
from .inputs import causal_text_sample
from .llama import LLAMA_KEYS, TINY_LLAMA_LIKE, llama_like_models

# Qwen/Qwen3-8B's config.json: the fields that set its shapes.
QWEN3_8B = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
    attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=36,
    tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="qwen3",
    stock_prefix="model",
    stock_prefixes={"Qwen3ForQuestionAnswering": "transformer"},
    config_class=FivefoldQwen3Config,
    models=llama_like_models(modeling, "Qwen3"),
    keys=lambda config: LLAMA_KEYS,
    tiny={**TINY_LLAMA_LIKE, "head_dim": 8},  # stock's default head_dim is 128
    public={"Qwen/Qwen3-8B": QWEN3_8B},
    sample_inputs=causal_text_sample,
)
