"""Public T5 checkpoints (t5-small ... t5-11b, t5-v1_1, flan-t5): no prefix; `shared` plus copies of it in each
stack's `embed_tokens` and (v1.0) `lm_head`; the relative position bias lives in block 0 of each stack."""

import torch

from fivefold.configuration.t5 import FivefoldT5Config
from fivefold.modeling import t5 as modeling

from .architecture import Architecture
from .keymap import KeyMap, renames

BIAS = "relative_attention_bias"


def _stack(stack: str, decoder: bool, gated: bool) -> dict[str, str | None]:
    block = f"{stack}.block.{{}}.layer"
    ours = f"{stack}.layers.{{}}"
    ff = 2 if decoder else 1  # the decoder's layer 1 is cross-attention
    rules = {
        f"{stack}.embed_tokens": f"{stack}.embeddings.word_embeddings",
        f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias": f"{stack}.relative_bias.{BIAS}",
        f"{block}.0.SelfAttention.q": f"{ours}.attn.q_proj",
        f"{block}.0.SelfAttention.k": f"{ours}.attn.k_proj",
        f"{block}.0.SelfAttention.v": f"{ours}.attn.v_proj",
        f"{block}.0.SelfAttention.o": f"{ours}.attn.o_proj",
        f"{block}.0.layer_norm": f"{ours}.norm_before_attn",
        f"{block}.{ff}.DenseReluDense.wo": f"{ours}.mlp.down_proj",
        f"{block}.{ff}.layer_norm": f"{ours}.norm_before_mlp",
        f"{stack}.final_layer_norm": f"{stack}.norm",
    }
    if gated:  # v1.1 / FLAN: gelu(wi_0) * wi_1
        rules |= {f"{block}.{ff}.DenseReluDense.wi_0": f"{ours}.mlp.gate_proj"}
        rules |= {f"{block}.{ff}.DenseReluDense.wi_1": f"{ours}.mlp.up_proj"}
    else:  # v1.0: relu(wi)
        rules |= {f"{block}.{ff}.DenseReluDense.wi": f"{ours}.mlp.up_proj"}
    if decoder:
        rules |= {
            f"{block}.1.EncDecAttention.q": f"{ours}.cross_attn.q_proj",
            f"{block}.1.EncDecAttention.k": f"{ours}.cross_attn.k_proj",
            f"{block}.1.EncDecAttention.v": f"{ours}.cross_attn.v_proj",
            f"{block}.1.EncDecAttention.o": f"{ours}.cross_attn.o_proj",
            f"{block}.1.layer_norm": f"{ours}.norm_before_cross",
            # Old files carry an unused bias for cross-attention (stock ignores it on load).
            f"{stack}.block.0.layer.1.EncDecAttention.relative_attention_bias": None,
        }
    return rules


def _base(gated: bool) -> dict[str, str | None]:
    encoder, decoder = _stack("encoder", False, gated), _stack("decoder", True, gated)
    return {"shared": "shared", **encoder, **decoder}


T5_HEADS = {"lm_head": "lm_head"}


# Both maps name our up projection `mlp.up_proj`; stock calls it `wi` in v1.0 and `wi_1` in v1.1 (gated).
T5_KEYS = KeyMap(renames(_base(gated=False)), renames(T5_HEADS))
T5_GATED_KEYS = KeyMap(renames(_base(gated=True)), renames(T5_HEADS))


def t5_keys(config) -> KeyMap:
    return T5_GATED_KEYS if config.is_gated_act else T5_KEYS


def t5_sample(config, stock_class: str, seed: int = 0) -> dict:
    """A padded encoder batch of unequal lengths and, for the classes with a decoder, decoder inputs (and labels
    with an ignored position) of another length."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, config.vocab_size, (3, 12), generator=gen)  # above pad (0) and EOS (1)
    attention_mask = (torch.arange(12)[None, :] < torch.tensor([[12], [9], [4]])).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if stock_class == "T5EncoderModel":
        return inputs
    targets = torch.randint(2, config.vocab_size, (3, 7), generator=gen)
    if stock_class == "T5ForConditionalGeneration":
        inputs["labels"] = targets.masked_fill(torch.arange(7) >= 5, -100)
    else:
        inputs["decoder_input_ids"] = targets
    return inputs


# Unequal depths, few buckets and a short max distance, so that every bucket range is exercised.
TINY_T5 = dict(
    vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=3, num_heads=4,
    relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
)  # fmt: skip

# google-t5/t5-small's config.json: the fields that set its shapes.
T5_SMALL = dict(
    vocab_size=32128,
    d_model=512,
    d_kv=64,
    d_ff=2048,
    num_layers=6,
    num_heads=8,
    feed_forward_proj="relu",
    decoder_start_token_id=0,
)  # fmt: skip

# google/flan-t5-base's config.json: the fields that set its shapes.
FLAN_T5_BASE = dict(
    vocab_size=32128,
    d_model=768,
    d_kv=64,
    d_ff=2048,
    num_layers=12,
    num_decoder_layers=12,
    num_heads=12,
    feed_forward_proj="gated-gelu",
    tie_word_embeddings=False,
    decoder_start_token_id=0,
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="t5",
    stock_prefix="",  # public T5 files have no prefix
    config_class=FivefoldT5Config,
    models={
        "AutoModel": modeling.FivefoldT5Model,
        "AutoModelForSeq2SeqLM": modeling.FivefoldT5ForConditionalGeneration,
        "AutoModelForTextEncoding": modeling.FivefoldT5EncoderModel,
    },
    keys=t5_keys,
    tiny=TINY_T5,
    public={"google-t5/t5-small": T5_SMALL, "google/flan-t5-base": FLAN_T5_BASE},
    sample_inputs=t5_sample,
    pipeline_fallbacks={"AutoModelForCausalLM": "AutoModelForSeq2SeqLM"},  # pipeline("text-generation"), as stock
)
