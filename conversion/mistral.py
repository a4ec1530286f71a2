"""Public Mistral checkpoints: the Llama layout (conversion/llama.py), `model.` prefix on every head model."""

from fivefold.configuration.mistral import FivefoldMistralConfig
from fivefold.modeling import mistral as modeling

from .architecture import Architecture
from .inputs import causal_text_sample
from .llama import LLAMA_KEYS, TINY_LLAMA_LIKE, llama_like_models

# mistralai/Mistral-7B-v0.3's config.json: the fields that set its shapes (no sliding window).
MISTRAL_7B_V0_3 = dict(
    vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0,
    sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="mistral",
    stock_prefix="model",
    config_class=FivefoldMistralConfig,
    models=llama_like_models(modeling, "Mistral"),
    keys=lambda config: LLAMA_KEYS,
    # A window shorter than the samples' 12 tokens, so that the tests see it.
    tiny={**TINY_LLAMA_LIKE, "sliding_window": 8},
    public={"mistralai/Mistral-7B-v0.3": MISTRAL_7B_V0_3},
    sample_inputs=causal_text_sample,
)
