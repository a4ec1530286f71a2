"""Public Mixtral checkpoints (`model.` prefix on head models): one tensor per expert projection
(`block_sparse_moe.experts.E.w1/w2/w3`), the same layout as fivefold's per-expert modules, so conversion is a
plain rename. Sharded files are read through their index like any other checkpoint."""

from .keymap import KeyMap, renames

MIXTRAL_BASE = {
    "embed_tokens": "embeddings.word_embeddings",
    "layers.{}.input_layernorm": "layers.{}.norm_before_attn",
    "layers.{}.self_attn.q_proj": "layers.{}.attn.q_proj",
    "layers.{}.self_attn.k_proj": "layers.{}.attn.k_proj",
    "layers.{}.self_attn.v_proj": "layers.{}.attn.v_proj",
    "layers.{}.self_attn.o_proj": "layers.{}.attn.o_proj",
    "layers.{}.post_attention_layernorm": "layers.{}.norm_before_mlp",
    "layers.{}.block_sparse_moe.gate": "layers.{}.mlp.router",
    "layers.{}.block_sparse_moe.experts.{}.w1": "layers.{}.mlp.experts.{}.gate_proj",
    "layers.{}.block_sparse_moe.experts.{}.w3": "layers.{}.mlp.experts.{}.up_proj",
    "layers.{}.block_sparse_moe.experts.{}.w2": "layers.{}.mlp.experts.{}.down_proj",
    "norm": "norm",
}

MIXTRAL_HEADS = {"lm_head": "lm_head", "score": "score"}

MIXTRAL_KEYS = KeyMap(renames(MIXTRAL_BASE), renames(MIXTRAL_HEADS))
