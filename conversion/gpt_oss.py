"""Public gpt-oss checkpoints (`model.` prefix on head models). Stock fuses each layer's experts: `gate_up_proj`
[E, C, 2F] with the gate and up columns interleaved (gate at even, up at odd positions) and its bias [E, 2F],
`down_proj` [E, F, C] and its bias [E, C]. The Hub's files hold those two weights in MXFP4 instead
(`*_blocks` [E, out, in/32, 16] packed FP4 pairs, `*_scales` [E, out, in/32] power-of-two exponents), dequantized
here by transformers' own integration. Both layouts become one module per expert; export writes the bf16 layout."""

import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from fivefold.configuration.gpt_oss import FivefoldGptOssConfig
from fivefold.modeling import gpt_oss as modeling

from .architecture import Architecture
from .inputs import causal_text_sample
from .keymap import TRANSFORMS, KeyMap, Rule, Transform, renames

GPT_OSS_BASE = {
    "embed_tokens": "embeddings.word_embeddings",
    "layers.{}.input_layernorm": "layers.{}.norm_before_attn",
    "layers.{}.self_attn.q_proj": "layers.{}.attn.q_proj",
    "layers.{}.self_attn.k_proj": "layers.{}.attn.k_proj",
    "layers.{}.self_attn.v_proj": "layers.{}.attn.v_proj",
    "layers.{}.self_attn.o_proj": "layers.{}.attn.o_proj",
    "layers.{}.self_attn.sinks": "layers.{}.attn.sinks",
    "layers.{}.post_attention_layernorm": "layers.{}.norm_before_mlp",
    "layers.{}.mlp.router": "layers.{}.mlp.router",
    "norm": "norm",
}
GPT_OSS_HEADS = {"lm_head": "lm_head", "score": "score"}


def _unfuse_gate_up(fused: torch.Tensor) -> list[torch.Tensor]:
    """[E, C, 2F] (or a bias [E, 2F]) -> per expert its gate and its up, as Linear weights [F, C] (biases [F])."""
    out = []
    for w in fused:
        out += [w[..., ::2].t().contiguous(), w[..., 1::2].t().contiguous()] if w.dim() == 2 else [w[::2], w[1::2]]
    return out


def _fuse_gate_up(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The inverse: each expert's gate and up [F, C] ([F]) interleaved into [C, 2F] ([2F]), stacked over experts."""
    pairs = zip(tensors[0::2], tensors[1::2], strict=True)
    return [torch.stack([torch.stack([g.t(), u.t()], dim=-1).flatten(-2) for g, u in pairs])]


def _unfuse_down(fused: torch.Tensor) -> list[torch.Tensor]:
    """[E, F, C] (or a bias [E, C]) -> per expert a Linear weight [C, F] (a bias [C])."""
    return [w.t().contiguous() if w.dim() == 2 else w for w in fused]


def _fuse_down(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.stack([w.t() if w.dim() == 2 else w for w in tensors])]


def _dequantized(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 [E, out, in/32, 16] + [E, out, in/32] -> [E, in, out] fp32, as stock's integration dequantizes them
    (every FP4 value times a power of two: exact in fp32)."""
    return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)


def _gate_up_shapes(src: list[tuple]) -> list[tuple]:  # [(E, C, 2F)] -> 2E x (F, C); [(E, 2F)] -> 2E x (F,)
    e, *rest, f2 = src[0]
    return [(f2 // 2, *rest)] * (2 * e)


def _fused_gate_up_shapes(src: list[tuple]) -> list[tuple]:  # 2E x (F, C) -> [(E, C, 2F)]; 2E x (F,) -> [(E, 2F)]
    f, *rest = src[0]
    return [(len(src) // 2, *rest, 2 * f)]


def _down_shapes(src: list[tuple]) -> list[tuple]:  # [(E, F, C)] -> E x (C, F); [(E, C)] -> E x (C,)
    e, *rest = src[0]
    return [tuple(reversed(rest))] * e


def _fused_down_shapes(src: list[tuple]) -> list[tuple]:  # E x (C, F) -> [(E, F, C)]; E x (C,) -> [(E, C)]
    return [(len(src), *reversed(src[0]))]


def _mxfp4_shapes(unfused_shapes):
    def shapes(src: list[tuple]) -> list[tuple]:  # [(E, out, in/32, 16), (E, out, in/32)]: the fused [E, in, out]
        e, out, groups, _ = src[0]
        return unfused_shapes([(e, groups * 32, out)])

    return shapes


TRANSFORMS.update(
    {
        "unfuse_gate_up": Transform("unfuse_gate_up", lambda t: _unfuse_gate_up(t[0]), _gate_up_shapes, "fuse_gate_up"),
        "fuse_gate_up": Transform("fuse_gate_up", _fuse_gate_up, _fused_gate_up_shapes, "unfuse_gate_up"),
        "unfuse_down": Transform("unfuse_down", lambda t: _unfuse_down(t[0]), _down_shapes, "fuse_down"),
        "fuse_down": Transform("fuse_down", _fuse_down, _fused_down_shapes, "unfuse_down"),
        # Exported in the bf16 layout: the inverse of a dequantization is the plain fusion.
        "mxfp4_gate_up": Transform(
            "mxfp4_gate_up",
            lambda t: _unfuse_gate_up(_dequantized(*t)),
            _mxfp4_shapes(_gate_up_shapes),
            "fuse_gate_up",
            torch.float32,
        ),
        "mxfp4_down": Transform(
            "mxfp4_down",
            lambda t: _unfuse_down(_dequantized(*t)),
            _mxfp4_shapes(_down_shapes),
            "fuse_down",
            torch.float32,
        ),
    }
)


def expert_rules(num_experts: int) -> list[Rule]:
    """The fused tensors of a layer's experts (bf16 layout first: export writes it) to one module per expert."""
    experts = [f"layers.{{}}.mlp.experts.{e}" for e in range(num_experts)]
    gate_up = tuple(f"{x}.{p}_proj.{{0}}" for x in experts for p in ("gate", "up"))
    down = tuple(f"{x}.down_proj.{{0}}" for x in experts)
    fused = "layers.{}.mlp.experts"

    def named(targets: tuple[str, ...], kind: str) -> tuple[str, ...]:
        return tuple(t.replace("{0}", kind) for t in targets)

    return [
        Rule((f"{fused}.gate_up_proj",), named(gate_up, "weight"), "unfuse_gate_up"),
        Rule((f"{fused}.gate_up_proj_bias",), named(gate_up, "bias"), "unfuse_gate_up"),
        Rule((f"{fused}.down_proj",), named(down, "weight"), "unfuse_down"),
        Rule((f"{fused}.down_proj_bias",), named(down, "bias"), "unfuse_down"),
        Rule(
            (f"{fused}.gate_up_proj_blocks", f"{fused}.gate_up_proj_scales"), named(gate_up, "weight"), "mxfp4_gate_up"
        ),
        Rule((f"{fused}.down_proj_blocks", f"{fused}.down_proj_scales"), named(down, "weight"), "mxfp4_down"),
    ]


def gpt_oss_keys(config) -> KeyMap:
    return KeyMap(renames(GPT_OSS_BASE) + expert_rules(config.num_local_experts), renames(GPT_OSS_HEADS))


# Four experts, two per token; two key/value heads for four query heads; sliding (a window of 4) and full layers
# alternating, and a sequence of 12 in the samples, longer than the window; yarn positions as the public configs
# have them. The clamp's limit is small enough to bite at these activations. The expert width, 40, is a multiple of
# 16 bytes, as stock's default `grouped_mm` experts on CPU need.
TINY_GPT_OSS = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    intermediate_size=40, num_local_experts=4, num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
    swiglu_limit=1.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 16},
)  # fmt: skip

# openai/gpt-oss-20b's config.json: the fields that set its shapes.
GPT_OSS_20B = dict(
    vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
    num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
    max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=True, swiglu_limit=7.0,
    tie_word_embeddings=False, pad_token_id=199999, eos_token_id=200002,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                     "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
)  # fmt: skip

ARCHITECTURE = Architecture(
    stock_model_type="gpt_oss",
    stock_prefix="model",
    config_class=FivefoldGptOssConfig,
    models={
        "AutoModel": modeling.FivefoldGptOssModel,
        "AutoModelForCausalLM": modeling.FivefoldGptOssForCausalLM,
        "AutoModelForSequenceClassification": modeling.FivefoldGptOssForSequenceClassification,
        "AutoModelForTokenClassification": modeling.FivefoldGptOssForTokenClassification,
    },
    keys=gpt_oss_keys,
    tiny=TINY_GPT_OSS,
    public={"openai/gpt-oss-20b": GPT_OSS_20B},
    sample_inputs=causal_text_sample,
    quantized_layouts=("mxfp4",),
)
