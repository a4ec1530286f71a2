"""Experts are placeable units: one layer's experts on different devices give the same output, the automatic
device map splits a layer's experts across (simulated) GPUs, and the saved layout never depends on placement."""

import torch
from safetensors.torch import load_file
from transformers.integrations.accelerate import _get_device_map

from fivefold import FivefoldMixtralConfig, FivefoldMixtralForCausalLM
from fivefold.conversion.inputs import causal_text_sample


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
