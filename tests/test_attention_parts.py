"""The attention parts the Llama-like decoders pick: rotary tables scaled by transformers' own rope functions
(with the attention factor they return, and dynamic's update with length), query/key RMSNorm per head and across
the width, and each layer's own sliding window."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from fivefold.configuration.llama import FivefoldLlamaConfig
from fivefold.configuration.mistral import FivefoldMistralConfig
from fivefold.configuration.qwen2 import FivefoldQwen2Config
from fivefold.configuration.qwen3 import FivefoldQwen3Config
from fivefold.conversion.llama import TINY_LLAMA_LIKE
from fivefold.modeling.attention import Attention, AttentionSpec
from fivefold.modeling.llama import FivefoldLlamaModel
from fivefold.modeling.llama_like import layer_window
from fivefold.modeling.norms import HeadRMSNorm, RMSNorm
from fivefold.modeling.rotary import RotaryEmbedding

ROPES = {
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
}


def rope_config(rope_type: str) -> LlamaConfig:
    rope = {"rope_type": rope_type, "rope_theta": 1e4, **ROPES[rope_type]}
    return LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=32, rope_parameters=rope)


def table_for(config: LlamaConfig) -> RotaryEmbedding:
    rope = config.rope_parameters
    return RotaryEmbedding(config.head_dim, rope["rope_theta"], rope["rope_type"], config=config)


@pytest.mark.parametrize("rope_type", sorted(ROPES))
def test_scaled_rotary_equals_stock_over_calls_of_changing_length(rope_type):
    """The same cos/sin as stock's LlamaRotaryEmbedding, call after call: for dynamic the table grows past the
    trained length (32) and comes back for short calls; yarn's attention factor scales cos and sin."""
    config = rope_config(rope_type)
    stock, ours = LlamaRotaryEmbedding(config), table_for(config)
    x = torch.zeros(1, dtype=torch.float32)
    for length in (8, 40, 64, 12, 50):
        position_ids = torch.arange(length)[None]
        expected = stock(x, position_ids)
        got = ours(position_ids, torch.float32)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b), (rope_type, length)
    if rope_type == "yarn":
        assert ours.attention_scaling == stock.attention_scaling != 1.0


def test_dynamic_rotary_regrows_and_resets_like_stock():
    config = rope_config("dynamic")
    ours = table_for(config)
    trained = ours.inv_freq.clone()
    ours(torch.arange(48)[None], torch.float32)
    assert not torch.equal(ours.inv_freq, trained)
    ours(torch.arange(4)[None], torch.float32)
    assert torch.equal(ours.inv_freq, trained)


@pytest.mark.parametrize("rope_type", ["llama3", "dynamic"])
def test_scaled_rotary_is_rebuilt_after_meta_loading(rope_type):
    config = rope_config(rope_type)
    with torch.device("meta"):
        table = table_for(config)
    table.to_empty(device="cpu")
    model = FivefoldLlamaModel(FivefoldLlamaConfig(**TINY_LLAMA_LIKE))
    model._init_weights(table)
    torch.testing.assert_close(table.inv_freq, table_for(config).inv_freq, rtol=0, atol=0)


def test_unsupported_rope_type_is_refused_by_name():
    rope = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}
    with pytest.raises(StrictDataclassClassValidationError, match="longrope"):
        FivefoldLlamaConfig(hidden_size=32, num_attention_heads=4, rope_parameters=rope)


@pytest.mark.parametrize(("kind", "width"), [("head", 8), ("width", 32)])
def test_query_key_norms_normalise_over_a_head_or_the_whole_width(kind, width):
    spec = AttentionSpec(hidden_size=32, num_heads=4, qk_norm=kind, qk_norm_eps=1e-5)
    attn = Attention(None, spec, 0)
    assert attn.q_norm.weight.shape == (width,) and attn.q_norm.eps == 1e-5
    x = torch.randn(2, 3, 32)
    if kind == "head":
        expected = RMSNorm(8, 1e-5)(x.view(2, 3, 4, 8)).view(2, 3, 32)
    else:
        expected = RMSNorm(32, 1e-5)(x)
    torch.testing.assert_close(attn.q_norm(x), expected)


def test_no_query_key_norm_is_identity():
    attn = Attention(None, AttentionSpec(hidden_size=32, num_heads=4), 0)
    assert isinstance(attn.q_norm, torch.nn.Identity) and isinstance(attn.k_norm, torch.nn.Identity)
    assert not isinstance(Attention(None, AttentionSpec(32, 4, qk_norm="head"), 0).k_norm, torch.nn.Identity)
    assert isinstance(Attention(None, AttentionSpec(32, 4, qk_norm="head"), 0).k_norm, HeadRMSNorm)


def test_layer_windows_follow_layer_types():
    qwen2 = FivefoldQwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=16, max_window_layers=2)
    assert [layer_window(qwen2, i) for i in range(4)] == [None, None, 15, 15]
    mistral = FivefoldMistralConfig(num_hidden_layers=2, sliding_window=16)
    assert [layer_window(mistral, i) for i in range(2)] == [15, 15]
    assert layer_window(FivefoldQwen2Config(num_hidden_layers=2), 1) is None  # use_sliding_window off


def test_sliding_layer_without_a_window_is_refused():
    with pytest.raises(StrictDataclassClassValidationError, match="sliding_window"):
        FivefoldQwen3Config(
            num_hidden_layers=2, sliding_window=None, layer_types=["full_attention", "sliding_attention"]
        )
