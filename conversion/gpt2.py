"""Public GPT-2 checkpoints: `transformer.` prefix on head models, none on `GPT2Model` and in legacy files
(which also store the causal-mask buffers `attn.bias` / `attn.masked_bias`).

GPT-2's Conv1D stores weights as (in, out); our Linears store (out, in), so every projection is transposed and
the fused `c_attn` is split into q/k/v.
"""

from .keymap import KeyMap, Rule, renames

GPT2_BASE = [
    *renames(
        {
            "wte": "embeddings.word_embeddings",
            "wpe": "embeddings.position_embeddings",
            "h.{}.ln_1": "layers.{}.norm_before_attn",
            "h.{}.ln_2": "layers.{}.norm_before_mlp",
            "ln_f": "norm",
            # The causal mask as a stored tensor (files written before transformers computed masks on the fly).
            "h.{}.attn.bias": None,
            "h.{}.attn.masked_bias": None,
        }
    ),
    Rule(
        ("h.{}.attn.c_attn",),
        ("layers.{}.attn.q_proj", "layers.{}.attn.k_proj", "layers.{}.attn.v_proj"),
        "transpose_split3",
    ),
    Rule(("h.{}.attn.c_proj",), ("layers.{}.attn.o_proj",), "transpose"),
    Rule(("h.{}.mlp.c_fc",), ("layers.{}.mlp.up_proj",), "transpose"),
    Rule(("h.{}.mlp.c_proj",), ("layers.{}.mlp.down_proj",), "transpose"),
]

GPT2_HEADS = renames({"lm_head": "lm_head", "score": "score", "classifier": "classifier"})

GPT2_KEYS = KeyMap(GPT2_BASE, GPT2_HEADS)
