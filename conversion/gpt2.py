"""Public GPT-2 checkpoints: `transformer.` prefix on head models, none on `GPT2Model` and in legacy files
(which also store the causal-mask buffers `attn.bias` / `attn.masked_bias`).

GPT-2's Conv1D stores weights as (in, out); our Linears store (out, in), so every projection is transposed and
the fused `c_attn` is split into q/k/v.
"""

from fivefold.configuration.gpt2 import FivefoldGPT2Config
from fivefold.modeling import gpt2 as modeling

from .architecture import Architecture
from .inputs import causal_text_sample
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

# Special ids below the random tokens of the samples, so that no real token reads as padding or the end.
TINY_GPT2 = dict(
    vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_inner=37, n_positions=64,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip

# openai-community/gpt2's config.json: the fields that set its shapes.
GPT2_124M = dict(
    vocab_size=50257,
    n_positions=1024,
    n_embd=768,
    n_layer=12,
    n_head=12,
    bos_token_id=50256,
    eos_token_id=50256,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="gpt2",
    stock_prefix="transformer",
    config_class=FivefoldGPT2Config,
    models={
        "AutoModel": modeling.FivefoldGPT2Model,
        "AutoModelForCausalLM": modeling.FivefoldGPT2LMHeadModel,
        "AutoModelForSequenceClassification": modeling.FivefoldGPT2ForSequenceClassification,
        "AutoModelForTokenClassification": modeling.FivefoldGPT2ForTokenClassification,
    },
    keys=lambda config: GPT2_KEYS,
    tiny=TINY_GPT2,
    public={"openai-community/gpt2": GPT2_124M},
    sample_inputs=causal_text_sample,
    lora_targets=("q_proj", "k_proj", "v_proj"),  # PEFT adapts stock's fused c_attn: all three
)
