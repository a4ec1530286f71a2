"""Public Mixtral checkpoints (`model.` prefix on head models): one tensor per expert projection
(`block_sparse_moe.experts.E.w1/w2/w3`), the same layout as fivefold's per-expert modules, so conversion is a
plain rename. Sharded files are read through their index like any other checkpoint. What stock transformers 5
writes with `save_pretrained(..., save_original_format=False)` (the router `mlp.gate`, fused `mlp.experts.*`)
is read too."""

from fivefold.configuration.mixtral import FivefoldMixtralConfig
from fivefold.modeling import mixtral as modeling

from .architecture import Architecture
from .experts import fused_expert_rules
from .inputs import causal_text_sample
from .keymap import KeyMap, Rule, renames
from .llama import LLAMA_ATTENTION, llama_like_models

MIXTRAL_BASE = {
    **LLAMA_ATTENTION,
    "layers.{}.block_sparse_moe.gate": "layers.{}.mlp.router",
    "layers.{}.block_sparse_moe.experts.{}.w1": "layers.{}.mlp.experts.{}.gate_proj",
    "layers.{}.block_sparse_moe.experts.{}.w3": "layers.{}.mlp.experts.{}.up_proj",
    "layers.{}.block_sparse_moe.experts.{}.w2": "layers.{}.mlp.experts.{}.down_proj",
}

MIXTRAL_HEADS = {"lm_head": "lm_head", "score": "score", "qa_outputs": "qa_outputs"}


def mixtral_keys(config) -> KeyMap:
    """Both expert layouts; the fused one is read only, and conversion back writes the Hub's."""
    fused = fused_expert_rules("layers.{}.mlp.experts", "layers.{}.mlp.experts", config.num_local_experts)
    router = Rule(("layers.{}.mlp.gate",), ("layers.{}.mlp.router",), import_only=True)
    return KeyMap([*renames(MIXTRAL_BASE), router, *fused], renames(MIXTRAL_HEADS))


# Four experts, two per token; two key/value heads for four query heads (grouped-query attention). The expert
# width is 40, not 37: stock's default `grouped_mm` experts on CPU need rows that are multiples of 16 bytes.
TINY_MIXTRAL = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=40, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip

# mistralai/Mixtral-8x7B-v0.1's config.json: the fields that set its shapes.
MIXTRAL_8X7B = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_local_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=32768,
    rms_norm_eps=1e-5,
    rope_theta=1e6,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="mixtral",
    stock_prefix="model",
    config_class=FivefoldMixtralConfig,
    models=llama_like_models(modeling, "Mixtral"),
    keys=mixtral_keys,
    tiny=TINY_MIXTRAL,
    public={"mistralai/Mixtral-8x7B-v0.1": MIXTRAL_8X7B},
    sample_inputs=causal_text_sample,
)
