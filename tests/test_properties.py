"""Property tests over random small configs of every architecture in fivefold.architectures.ARCHITECTURES:
convert -> export -> convert is the identity on weights; unpadded == padded; cached == uncached decoding.

A config is drawn by varying the fields of the architecture's tiny config that have a known meaning (depth,
width per head, feed-forward width, vocabulary); fields it does not know stay as the architecture set them, so a
new architecture joins with its ARCHITECTURES row. Examples are few and derandomized: the suite stays fast and
a failure reproduces.
"""

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import fivefold
from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.samples import build_stock_checkpoint

FEW = settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

DEPTH = ("num_hidden_layers", "n_layer", "num_layers")
WIDTH_AND_HEADS = (("hidden_size", "num_attention_heads"), ("n_embd", "n_head"), ("d_model", "num_heads"))
FEED_FORWARD = ("intermediate_size", "n_inner", "d_ff")


@st.composite
def small_configs(draw, arch) -> dict:
    """Overrides of `arch.tiny`: 1-3 layers, the same heads with 4-16 channels each, any feed-forward width, a
    vocabulary above every special token id the tiny config names."""
    tiny, out = arch.tiny, {}
    for key in DEPTH:
        if key in tiny:
            out[key] = draw(st.integers(1, 3))
    for width, heads in WIDTH_AND_HEADS:
        if width in tiny and heads in tiny:
            out[width] = tiny[heads] * draw(st.sampled_from([4, 8, 16]))
    for key in FEED_FORWARD:
        if tiny.get(key):
            out[key] = draw(st.integers(4, 64))
    if "vocab_size" in tiny:
        special = [v for k, v in tiny.items() if k.endswith("_token_id") and isinstance(v, int)]
        out["vocab_size"] = draw(st.integers(max([3, *special]) + 8, 128))
    return out


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # hypothesis' sweep of configs: 35 s
@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.stock_model_type)
def test_convert_export_convert_is_the_identity(arch):
    stock_names = sorted(stock_class_name(cls) for cls in arch.models.values())

    @FEW
    @given(overrides=small_configs(arch), stock_name=st.sampled_from(stock_names), seed=st.integers(0, 2**16))
    def check(overrides, stock_name, seed):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            src = build_stock_checkpoint(arch.stock_model_type, stock_name, tmp / "src", seed=seed, **overrides)
            ours = fivefold.convert(src, tmp / "ours", max_shard_size="30KB", progress=False)
            stock = fivefold.export(ours, tmp / "stock", progress=False)
            again = fivefold.convert(stock, tmp / "again", progress=False)
            assert _same(_tensors(stock), _tensors(src))
            assert _same(_tensors(again), _tensors(ours))

    check()


# --- unpadded == padded -------------------------------------------------------------------------------------
# The hook expected from unpadded execution: a config field `unpad_inputs` (True: a padded batch is packed into
# its real tokens inside the model, for the kernels that support it; False: the padded path). An architecture
# whose config has the field joins; outputs are compared at real tokens (padded positions may differ by design).


def _unpadding_architectures():
    return [
        pytest.param(a, id=a.stock_model_type)
        for a in ARCHITECTURES
        if hasattr(a.config_class(**a.tiny), "unpad_inputs")
    ]


@pytest.mark.parametrize("arch", _unpadding_architectures())
def test_unpadded_equals_padded(arch):
    @FEW
    @given(overrides=small_configs(arch), seed=st.integers(0, 2**16))
    def check(overrides, seed):
        torch.manual_seed(seed)
        model = arch.base_model(arch.config_class(**{**arch.tiny, **overrides})).eval()
        model.set_attn_implementation("sdpa")
        inputs = arch.sample_inputs(model.config, stock_class_name(arch.base_model), seed)
        real = inputs["attention_mask"].bool()
        outputs = {}
        for unpad in (False, True):
            model.config.unpad_inputs = unpad
            with torch.no_grad():
                outputs[unpad] = model(**inputs).last_hidden_state
        assert (outputs[True][real] - outputs[False][real]).abs().max() <= 1e-5

    check()


# --- cached == uncached decoding ----------------------------------------------------------------------------
# Every class that can generate (GenerationMixin): greedy decoding with and without the KV cache gives the same
# tokens and the same scores.


def _generating_classes():
    return [
        pytest.param(a, cls, id=cls.__name__) for a in ARCHITECTURES for cls in a.models.values() if cls.can_generate()
    ]


@pytest.mark.parametrize(("arch", "cls"), _generating_classes())
def test_cached_equals_uncached_decoding(arch, cls):
    @FEW
    @given(overrides=small_configs(arch), seed=st.integers(0, 2**16))
    def check(overrides, seed):
        torch.manual_seed(seed)
        model = cls(arch.config_class(**{**arch.tiny, **overrides})).eval()
        inputs = arch.sample_inputs(model.config, stock_class_name(cls), seed)
        runs = {}
        for use_cache in (True, False):
            with torch.no_grad():
                runs[use_cache] = model.generate(
                    **inputs,
                    max_new_tokens=4,
                    do_sample=False,
                    use_cache=use_cache,
                    output_scores=True,
                    return_dict_in_generate=True,
                )
        assert torch.equal(runs[True].sequences, runs[False].sequences)
        for cached, uncached in zip(runs[True].scores, runs[False].scores, strict=True):
            # fp32 sums in another order: T5's unscaled attention carries ~1e-4 of the scores' own size
            torch.testing.assert_close(cached, uncached, rtol=1e-4, atol=1e-4)

    check()
