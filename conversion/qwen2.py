"""Public Qwen2 and Qwen2.5 checkpoints: the Llama layout (conversion/llama.py) with q/k/v biases, `model.` prefix on
head models, `transformer.` on Qwen2ForQuestionAnswering."""

from fivefold.configuration.qwen2 import FivefoldQwen2Config
from fivefold.modeling import qwen2 as modeling

from .architecture import Architecture
from .inputs import causal_text_sample
from .llama import LLAMA_KEYS, TINY_LLAMA_LIKE, llama_like_models

# Qwen/Qwen2.5-7B's config.json: the fields that set its shapes (use_sliding_window false: every layer full).
QWEN2_5_7B = dict(
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0,
    use_sliding_window=False, sliding_window=131072, max_window_layers=28, tie_word_embeddings=False,
    bos_token_id=151643, eos_token_id=151643,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="qwen2",
    stock_prefix="model",
    stock_prefixes={"Qwen2ForQuestionAnswering": "transformer"},
    config_class=FivefoldQwen2Config,
    models=llama_like_models(modeling, "Qwen2"),
    keys=lambda config: LLAMA_KEYS,
    # The second layer slides (max_window_layers=1), over a window shorter than the samples' 12 tokens.
    tiny={**TINY_LLAMA_LIKE, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    public={"Qwen/Qwen2.5-7B": QWEN2_5_7B},
    sample_inputs=causal_text_sample,
)
