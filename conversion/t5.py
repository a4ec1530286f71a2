"""Public T5 checkpoints (t5-small ... t5-11b, t5-v1_1, flan-t5): no prefix; `shared` plus copies of it in each
stack's `embed_tokens` and (v1.0) `lm_head`; the relative position bias lives in block 0 of each stack."""

from collections.abc import Iterable

import torch

from .keymap import KeyMap, Plan, renames

BIAS = "relative_attention_bias"


def _stack(stack: str, decoder: bool, gated: bool) -> dict[str, str | None]:
    block = f"{stack}.block.{{}}.layer"
    ours = f"{stack}.layers.{{}}"
    ff = 2 if decoder else 1  # the decoder's layer 1 is cross-attention
    rules = {
        f"{stack}.embed_tokens": f"{stack}.embed_tokens",
        f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias": f"{stack}.relative_bias.{BIAS}",
        f"{block}.0.SelfAttention.q": f"{ours}.attn.q_proj",
        f"{block}.0.SelfAttention.k": f"{ours}.attn.k_proj",
        f"{block}.0.SelfAttention.v": f"{ours}.attn.v_proj",
        f"{block}.0.SelfAttention.o": f"{ours}.attn.o_proj",
        f"{block}.0.layer_norm": f"{ours}.norm_before_attn",
        f"{block}.{ff}.DenseReluDense.wo": f"{ours}.mlp.down_proj",
        f"{block}.{ff}.layer_norm": f"{ours}.norm_before_mlp",
        f"{stack}.final_layer_norm": f"{stack}.final_norm",
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


class T5KeyMap(KeyMap):
    """Both directions name our up projection `mlp.up_proj`, but stock calls it `wi` in v1.0 and `wi_1` in v1.1.
    Which flavour a checkpoint is shows in its keys (a gate projection or not), so the rules are chosen per plan."""

    def __init__(self):
        super().__init__(renames(_base(gated=False)), renames(T5_HEADS))
        self.gated = KeyMap(renames(_base(gated=True)), renames(T5_HEADS))

    def plan(self, keys: Iterable[str], stock_prefix: str, our_prefix: str, inverse: bool = False) -> Plan:
        keys = list(keys)
        if any(".DenseReluDense.wi_0." in k or ".mlp.gate_proj." in k for k in keys):
            return self.gated.plan(keys, stock_prefix, our_prefix, inverse)
        return super().plan(keys, stock_prefix, our_prefix, inverse)


T5_KEYS = T5KeyMap()


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
