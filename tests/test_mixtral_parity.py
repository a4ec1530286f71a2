"""Mixtral against stock MixtralForCausalLM on the same tiny random weights: greedy generation (plain, sharded,
sliding window), the router outputs and the auxiliary losses, jitter noise in training, incremental decoding,
and the lossless round trip."""

import json

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError

import fivefold
from fivefold import FivefoldMixtralConfig, FivefoldMixtralForCausalLM
from fivefold.conversion.inputs import causal_text_sample
from fivefold.conversion.samples import build_stock_checkpoint
from fivefold.conversion.verify import verify
from fivefold.modeling.moe import router_z_loss

TOL = 1e-4
NEW_TOKENS = 24


def _stock_and_ours(folder, attn="sdpa"):
    stock = transformers.MixtralForCausalLM.from_pretrained(folder, attn_implementation=attn).eval()
    ours = FivefoldMixtralForCausalLM.from_pretrained(folder, attn_implementation=attn).eval()
    return stock, ours


def _labelled_sample(config) -> tuple[dict, torch.Tensor]:
    inputs = causal_text_sample(config, "MixtralForCausalLM")
    return inputs, inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)


def _greedy(model, inputs):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A tiny stock Mixtral saved in several shards, as the public checkpoints are, and its conversion."""
    root = tmp_path_factory.mktemp("mixtral-sharded")
    src = build_stock_checkpoint("mixtral", "MixtralForCausalLM", root / "stock")
    model = transformers.MixtralForCausalLM.from_pretrained(src)
    model.save_pretrained(root / "stock-sharded", max_shard_size="40KB")
    index = json.loads((root / "stock-sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert any(".block_sparse_moe.experts.3.w2." in k for k in index["weight_map"])  # the public per-expert names
    return root / "stock-sharded", fivefold.convert(root / "stock-sharded", root / "fivefold", progress=False)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_greedy_generation_matches_stock(converted, attn, linear_path):
    src, dst = converted("mixtral", "MixtralForCausalLM")
    stock, _ = _stock_and_ours(src, attn)
    ours = FivefoldMixtralForCausalLM.from_pretrained(dst, attn_implementation=attn).eval()
    inputs = causal_text_sample(stock.config, "MixtralForCausalLM")  # ragged, left-padded prompts
    assert inputs["attention_mask"][:, 0].min() == 0
    expected, got = _greedy(stock, inputs), _greedy(ours, inputs)
    assert got.shape[1] == inputs["input_ids"].shape[1] + NEW_TOKENS
    assert torch.equal(expected, got)


@pytest.mark.parametrize(
    "options",
    [dict(do_sample=True, top_k=20, temperature=0.8), dict(num_beams=3, do_sample=False)],
    ids=["sampling", "beam-search"],
)
def test_sampling_and_beam_search_match_stock(converted, options, linear_path):
    src, dst = converted("mixtral", "MixtralForCausalLM")
    stock = transformers.MixtralForCausalLM.from_pretrained(src).eval()
    ours = FivefoldMixtralForCausalLM.from_pretrained(dst).eval()
    inputs = causal_text_sample(stock.config, "MixtralForCausalLM")
    runs = []
    for model in (stock, ours):
        torch.manual_seed(0)
        with torch.no_grad():
            runs.append(model.generate(**inputs, max_new_tokens=12, min_new_tokens=12, **options))
    assert torch.equal(*runs)


def test_sharded_stock_checkpoint_converts_and_loads_directly(sharded):
    src, dst = sharded
    assert max(verify(src, dst).values()) <= TOL
    stock, direct = _stock_and_ours(src)  # our from_pretrained on the stock shards, converted in memory
    inputs = causal_text_sample(stock.config, "MixtralForCausalLM", seed=1)
    assert torch.equal(_greedy(stock, inputs), _greedy(direct, inputs))
    with torch.no_grad():
        a = stock(**inputs).logits
        b = FivefoldMixtralForCausalLM.from_pretrained(dst).eval()(**inputs).logits
    mask = inputs["attention_mask"].bool()
    assert (a - b)[mask].abs().max() <= TOL


def test_sharded_round_trip_is_lossless(sharded, tmp_path):
    from safetensors.torch import load_file

    src, dst = sharded
    out = fivefold.export(dst, tmp_path / "stock-again", max_shard_size="40KB", progress=False)

    def tensors(folder):
        found = {}
        for file in folder.glob("*.safetensors"):
            found.update(load_file(file))
        return found

    original, exported = tensors(src), tensors(out)
    assert set(original) == set(exported)
    assert all(torch.equal(original[k], exported[k]) for k in original)


def test_sliding_window_generation_matches_stock(stock_checkpoint):
    """A window shorter than the prompt: the mask and the sliding-window cache both matter."""
    src = stock_checkpoint("mixtral", "MixtralForCausalLM", sliding_window=5)
    stock, ours = _stock_and_ours(src)
    assert ours.config.sliding_window == 5
    inputs = causal_text_sample(stock.config, "MixtralForCausalLM")
    with torch.no_grad():
        a, b = stock(**inputs).logits, ours(**inputs).logits
    assert (a - b)[inputs["attention_mask"].bool()].abs().max() <= TOL
    expected, got = _greedy(stock, inputs), _greedy(ours, inputs)
    assert torch.equal(expected, got)
    full = transformers.MixtralForCausalLM.from_pretrained(src, sliding_window=None).eval()
    assert not torch.equal(_greedy(full, inputs), expected)  # the window changed the result


def test_router_logits_and_aux_loss_match_stock(converted):
    src, dst = converted("mixtral", "MixtralForCausalLM")
    stock = transformers.MixtralForCausalLM.from_pretrained(src).eval()
    ours = FivefoldMixtralForCausalLM.from_pretrained(dst).eval()
    inputs, labels = _labelled_sample(stock.config)
    with torch.no_grad():
        a = stock(**inputs, labels=labels, output_router_logits=True)
        b = ours(**inputs, labels=labels, output_router_logits=True)
        plain = ours(**inputs, labels=labels)
    assert len(b.router_logits) == stock.config.num_hidden_layers
    for x, y in zip(a.router_logits, b.router_logits, strict=True):
        assert x.shape == y.shape == (labels.numel(), stock.config.num_local_experts)
        assert (x - y).abs().max() <= TOL
    assert abs(a.aux_loss - b.aux_loss) <= 1e-5
    assert abs(a.loss - b.loss) <= 1e-5
    # the aux loss is in the loss, scaled by router_aux_loss_coef, only when the router logits are asked for
    assert plain.aux_loss is None and plain.router_logits is None
    assert torch.allclose(b.loss - plain.loss, stock.config.router_aux_loss_coef * b.aux_loss, atol=1e-6)


def test_router_z_loss_is_added_when_configured(converted):
    _, dst = converted("mixtral", "MixtralForCausalLM")
    ours = FivefoldMixtralForCausalLM.from_pretrained(dst, router_z_loss_coef=0.01).eval()
    base = FivefoldMixtralForCausalLM.from_pretrained(dst).eval()
    inputs, labels = _labelled_sample(ours.config)
    with torch.no_grad():
        with_z = ours(**inputs, labels=labels, output_router_logits=True)
        without = base(**inputs, labels=labels, output_router_logits=True)
    z = router_z_loss(with_z.router_logits, inputs["attention_mask"])
    assert z > 0
    assert torch.allclose(with_z.loss - without.loss, 0.01 * z, atol=1e-6)


def test_jitter_noise_in_training_matches_stock(stock_checkpoint):
    src = stock_checkpoint("mixtral", "MixtralForCausalLM", router_jitter_noise=0.2)
    stock, ours = _stock_and_ours(src, attn="eager")
    stock.train(), ours.train()
    inputs = causal_text_sample(stock.config, "MixtralForCausalLM")
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        torch.manual_seed(5)
        a = stock(**inputs).logits
        torch.manual_seed(5)
        b = ours(**inputs).logits
        assert (a - b)[mask].abs().max() <= TOL
        assert not torch.allclose(b, ours.eval()(**inputs).logits)


def test_incremental_decoding_equals_full_forward(converted):
    _, dst = converted("mixtral", "MixtralForCausalLM")
    ours = FivefoldMixtralForCausalLM.from_pretrained(dst).eval()
    ids = causal_text_sample(ours.config, "MixtralForCausalLM")["input_ids"][:1]  # the full row
    with torch.no_grad():
        full = ours(ids).logits
        out = ours(ids[:, :5], use_cache=True)
        steps = [out.logits]
        for t in range(5, ids.shape[1]):
            out = ours(ids[:, t : t + 1], cache=out.cache, use_cache=True)
            steps.append(out.logits)
    assert (torch.cat(steps, dim=1) - full).abs().max() <= TOL


def test_sequence_classification_with_padding_matches_stock(converted):
    src, dst = converted("mixtral", "MixtralForSequenceClassification")
    assert max(verify(src, dst).values()) <= TOL


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(num_local_experts=2, num_experts_per_tok=3), "num_experts_per_tok"),
        (dict(hidden_size=30, num_attention_heads=4), "num_attention_heads"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads"),
        (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}), "rope_type"),
    ],
)
def test_config_refuses_inconsistent_fields(fields, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FivefoldMixtralConfig(**{"hidden_size": 32, "intermediate_size": 40, **fields})


def test_converted_mixtral_loads_as_remote_code_without_fivefold(converted, tmp_path):
    from test_remote_code import _remote_logits

    src, dst = converted("mixtral", "MixtralForCausalLM")
    assert {"modeling_mixtral.py", "modeling_moe.py", "modeling_decoder.py"} <= {p.name for p in dst.glob("*.py")}
    stock = transformers.MixtralForCausalLM.from_pretrained(src).eval()
    inputs = causal_text_sample(stock.config, "MixtralForCausalLM")
    remote = _remote_logits(tmp_path, dst, "AutoModelForCausalLM", inputs)
    assert remote["cls"] == "FivefoldMixtralForCausalLM" and remote["module"].startswith("transformers_modules.")
    with torch.no_grad():
        expected = stock(**inputs).logits
    assert (remote["logits"] - expected)[inputs["attention_mask"].bool()].abs().max() <= TOL
