"""Mixtral against stock on the same tiny random weights: sharded checkpoints (converted, loaded directly, round
trip), stock 5's fused layout, a sliding window shorter than the prompt, the router outputs and the auxiliary
losses, jitter noise in training, incremental decoding, config rules; experts as placeable units (split across
devices, the saved layout independent of placement); Mixtral-8x7B's per-expert files at the public size on the
meta device. (generate() against stock: test_generation.py; the MoE layer alone: test_moe_layer.py.)"""

import json
import re

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file
from transformers.integrations.accelerate import _get_device_map

import fivefold
from fivefold import FivefoldMixtralConfig, FivefoldMixtralForCausalLM
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.inputs import causal_text_sample
from fivefold.conversion.samples import build_stock_checkpoint
from fivefold.conversion.verify import verify
from fivefold.modeling.moe import router_z_loss

from helpers import plan_on_meta, public_stock_model, read_tensors, shapes_on_disk, stock_parameters

ARCH = architecture_for_model_type("mixtral")
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


@pytest.mark.slow
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


def test_the_fused_layout_stock_can_save_converts_and_loads_as_the_hubs(stock_checkpoint, tmp_path):
    """`save_pretrained(save_original_format=False)` writes stock 5's fused experts and `mlp.gate` router."""
    src = stock_checkpoint("mixtral", "MixtralForCausalLM")
    transformers.MixtralForCausalLM.from_pretrained(src).save_pretrained(tmp_path / "fused", save_original_format=False)
    assert any(k.endswith(".mlp.experts.gate_up_proj") for k in load_file(tmp_path / "fused" / "model.safetensors"))
    a = read_tensors(fivefold.convert(src, tmp_path / "a", progress=False))
    b = read_tensors(fivefold.convert(tmp_path / "fused", tmp_path / "b", progress=False))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    stock, ours = _stock_and_ours(tmp_path / "fused")  # fivefold's class reads the fused folder directly too
    inputs = causal_text_sample(stock.config, "MixtralForCausalLM")
    with torch.no_grad():
        assert (stock(**inputs).logits - ours(**inputs).logits).abs().max() <= TOL
    back = load_file(fivefold.export(tmp_path / "b", tmp_path / "stock", progress=False) / "model.safetensors")
    assert set(back) == set(load_file(src / "model.safetensors"))  # the Hub's per-expert layout


def test_sharded_round_trip_is_lossless(sharded, tmp_path):
    src, dst = sharded
    out = fivefold.export(dst, tmp_path / "stock-again", max_shard_size="40KB", progress=False)
    original, exported = read_tensors(src), read_tensors(out)
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


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(num_local_experts=2, num_experts_per_tok=3), "num_experts_per_tok"),
        (dict(hidden_size=30, num_attention_heads=4), "num_attention_heads"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads"),
        # Linear, dynamic, yarn, llama3 are computed by transformers' rope functions; longrope is not followed.
        (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}), "rope_type"),
    ],
)
def test_config_refuses_inconsistent_fields(fields, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FivefoldMixtralConfig(**{"hidden_size": 32, "intermediate_size": 40, **fields})


def test_converted_folder_ships_the_moe_and_decoder_modules(converted):
    _, dst = converted("mixtral", "MixtralForCausalLM")
    assert {"modeling_mixtral.py", "modeling_moe.py", "modeling_decoder.py"} <= {p.name for p in dst.glob("*.py")}


# --- experts as placeable units ------------------------------------------------------------------------------


def _split_layer_map(config, on_disk: set[int]) -> dict[str, str]:
    """Everything on the CPU, except the given experts of layer 0, which are offloaded to disk."""
    device_map = {"model.embeddings": "cpu", "model.rotary": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    for part in ("norm_before_attn", "attn", "norm_before_mlp", "mlp.router"):
        device_map[f"model.layers.0.{part}"] = "cpu"
    for e in range(config.num_local_experts):
        device_map[f"model.layers.0.mlp.experts.{e}"] = "disk" if e in on_disk else "cpu"
    for i in range(1, config.num_hidden_layers):
        device_map[f"model.layers.{i}"] = "cpu"
    return device_map


def test_experts_of_one_layer_on_cpu_and_disk_give_the_same_logits(converted, tmp_path):
    _, dst = converted("mixtral", "MixtralForCausalLM")
    plain = FivefoldMixtralForCausalLM.from_pretrained(dst).eval()
    device_map = _split_layer_map(plain.config, on_disk={1, 3})
    placed = FivefoldMixtralForCausalLM.from_pretrained(
        dst, device_map=device_map, offload_folder=tmp_path / "offload"
    ).eval()
    assert placed.hf_device_map["model.layers.0.mlp.experts.1"] == "disk"
    assert placed.hf_device_map["model.layers.0.mlp.experts.0"] == "cpu"
    offloaded = placed.model.layers[0].mlp.experts[1]
    assert offloaded.up_proj.weight.device.type == "meta"  # really on disk until its turn
    assert hasattr(offloaded, "_hf_hook") and not hasattr(placed.model.layers[0].mlp, "_hf_hook")

    inputs = causal_text_sample(plain.config, "MixtralForCausalLM")
    with torch.no_grad():
        expected, got = plain(**inputs).logits, placed(**inputs).logits
        assert torch.equal(plain.generate(**inputs, max_new_tokens=8), placed.generate(**inputs, max_new_tokens=8))
    assert (expected - got).abs().max() <= 1e-5

    placed.save_pretrained(tmp_path / "saved")  # the layout is the same wherever the experts sat
    saved, original = load_file(tmp_path / "saved" / "model.safetensors"), load_file(dst / "model.safetensors")
    assert set(saved) == set(original)
    assert all(torch.equal(saved[k], original[k]) for k in original)


def test_auto_device_map_splits_one_layers_experts_across_gpus():
    config = FivefoldMixtralConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=8,
    )  # fmt: skip
    with torch.device("meta"):
        model = FivefoldMixtralForCausalLM(config)
    expert = 3 * 64 * 256 * 4  # bytes of one SwiGLU expert in fp32
    front = (1000 * 64 + 4 * 64 * 64 + 2 * 64) * 4  # embeddings, attention, norms, router of layer 0
    max_memory = {0: front + int(2.5 * expert), 1: 4 * expert, 2: 10**9, "cpu": 10**9}  # three simulated GPUs
    device_map = _get_device_map(model, "sequential", max_memory, None)  # what from_pretrained computes

    layer0 = {device_map[f"model.layers.0.mlp.experts.{e}"] for e in range(8)}
    assert {0, 1} <= layer0  # one layer's experts on two GPUs
    assert "model.layers.0" not in device_map and "model.layers.0.attn" in device_map
    assert not any(k.startswith("model.layers.0.mlp.experts.0.") for k in device_map)  # an expert stays whole


# --- Mixtral-8x7B at its public size -------------------------------------------------------------------------


@pytest.mark.parametrize("stock_class", ["MixtralForCausalLM", "MixtralModel"])
def test_mixtral_8x7b_per_expert_files_convert_completely(stock_class):
    """The public files hold one tensor per expert projection; transformers 5 fuses the experts in memory and
    writes them per expert again on saving: every stock tensor accounted for, eight whole experts per layer."""
    stock = public_stock_model(ARCH, ARCH.public["mistralai/Mixtral-8x7B-v0.1"], stock_class)
    shapes = {}
    for key, tensor in stock.state_dict().items():
        fused = re.match(r"(.*)\.mlp\.experts\.(gate_up_proj|down_proj)$", key)
        if not fused:
            shapes[key.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = tuple(tensor.shape)
            continue
        prefix, name = fused.groups()
        experts, rows, cols = tensor.shape
        for e in range(experts):
            base = f"{prefix}.block_sparse_moe.experts.{e}"
            if name == "down_proj":
                shapes[f"{base}.w2.weight"] = (rows, cols)
            else:
                shapes[f"{base}.w1.weight"] = shapes[f"{base}.w3.weight"] = (rows // 2, cols)
    assert shapes == shapes_on_disk(stock)  # the public layout is what save_pretrained writes
    meta = plan_on_meta(ARCH, stock, shapes)
    expected = meta.expected

    assert {s for step in meta.plan.steps for s in step.sources} == set(shapes) and not meta.plan.dropped
    assert set(meta.produced) == set(expected) and not meta.tied
    assert all(meta.produced[k] == expected[k] for k in expected)
    layer = "model.layers.31" if stock_class.endswith("CausalLM") else "layers.31"
    experts = {
        k.removeprefix(f"{layer}.mlp.experts.").split(".")[0] for k in expected if k.startswith(f"{layer}.mlp.experts.")
    }
    assert experts == {str(e) for e in range(8)}
    assert expected[f"{layer}.mlp.experts.7.down_proj.weight"] == (4096, 14336)
    assert expected[f"{layer}.attn.k_proj.weight"] == (1024, 4096)  # 8 key/value heads of 128
    assert expected[f"{layer}.mlp.router.weight"] == (8, 4096)
    assert meta.parameters == stock_parameters(stock)  # 46.7B: really the public size


MOE_DECODERS = [
    ("mixtral", "MixtralForCausalLM"),
    ("qwen2_moe", "Qwen2MoeForCausalLM"),
    ("qwen3_moe", "Qwen3MoeForCausalLM"),
    ("olmoe", "OlmoeForCausalLM"),
    ("gpt_oss", "GptOssForCausalLM"),
]


@pytest.mark.parametrize(("model_type", "stock_name"), MOE_DECODERS, ids=[m for m, _ in MOE_DECODERS])
def test_the_loss_reads_stocks_model_attributes(converted, model_type, stock_name):
    """Stock's causal LMs set `router_aux_loss_coef`, `num_experts` and `num_experts_per_tok` (and `vocab_size`)
    on the model when built, and its loss reads those: a user tuning `model.router_aux_loss_coef` after loading
    changes the loss, a config field changed after loading changes nothing."""
    src, dst = converted(model_type, stock_name)
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    ours = transformers.AutoModelForCausalLM.from_pretrained(dst).eval()
    for name in ("router_aux_loss_coef", "num_experts", "num_experts_per_tok", "vocab_size"):
        assert getattr(ours, name) == getattr(stock, name), name
    ids = torch.tensor([[5, 17, 42, 8, 9, 11], [7, 3, 21, 30, 4, 6]])
    for model in (stock, ours):
        model.router_aux_loss_coef = 0.5
        model.config.router_aux_loss_coef = 0.25  # read by neither
        model.config.num_experts_per_tok = 1  # nor this: the routing and its loss keep the top k they were built with
    with torch.no_grad():
        a, b = (m(input_ids=ids, labels=ids, output_router_logits=True) for m in (stock, ours))
    assert abs(a.aux_loss - b.aux_loss) <= 1e-5 and abs(a.loss - b.loss) <= 1e-5
