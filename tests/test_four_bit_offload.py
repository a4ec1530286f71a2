"""4-bit experts bigger than memory: a checkpoint saved by bitsandbytes in 4 bits (NF4, FP4, double quantization)
loads with its experts on "disk" (transformers' bitsandbytes quantizer refuses "cpu" and "disk"), each read from the
checkpoint when it runs in its stored form (packed data and quantization state: an eighth of an fp32 expert's
bytes and a little more), cached and evicted in those bytes; outputs equal the 4-bit model loaded whole; the model
saves its experts as they are stored."""

import pytest
import torch
import transformers
from safetensors import safe_open

from fivefold.architectures import stock_class_name
from fivefold.conversion.inputs import causal_text_sample
from fivefold.modeling import expert_cache
from fivefold.modeling.quantized_experts import held_bytes, leaf_tensors

pytest.importorskip("bitsandbytes")
from test_expert_offload import (
    MOE,
    _causal_lm,
    _left,
    _max_diff,
    _odd_experts_on_disk,
    loaded_leaving_odd_experts,
    quantized_checkpoints,
)

CONFIGS = {
    "nf4": dict(bnb_4bit_quant_type="nf4"),
    "fp4-double": dict(bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=True),
}
MIXTRAL = [a for a in MOE if a.stock_model_type == "mixtral"]


def wide(arch) -> dict:
    """The tiny config, widened to bitsandbytes' block of 64: its CPU kernel (bitsandbytes 0.50, AVX-512 BF16) fails
    on a layer narrower than a block, stock's and fivefold's alike (test_quantization.py)."""
    widths = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 128}
    widths |= {"shared_expert_intermediate_size": 128}
    out = {key: width for key, width in widths.items() if key in arch.tiny}
    if "head_dim" in arch.tiny:
        out["head_dim"] = 64 // arch.tiny["num_attention_heads"]
    return out


@pytest.fixture(scope="module")
def four_bit_folder(converted, tmp_path_factory):
    """Per architecture and config: (class, the fp32 folder, the 4-bit folder, the 4-bit model whole); skipped where
    bitsandbytes fails on the whole model."""
    config = transformers.BitsAndBytesConfig
    made = quantized_checkpoints(
        converted,
        tmp_path_factory,
        lambda kind: config(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32, **CONFIGS[kind]),
        wide,
    )
    failures = {}

    def make(arch, kind: str = "nf4"):
        found, key = made(arch, kind), (arch.stock_model_type, kind)
        if key not in failures:
            try:
                with torch.no_grad():
                    found[3](**causal_text_sample(found[3].config, "MixtralForCausalLM"))
                failures[key] = None
            except (AssertionError, RuntimeError) as error:  # qwen2_moe's shared expert gate: one output row
                failures[key] = f"bitsandbytes fails on the whole 4-bit model on this CPU too: {error}"
        if failures[key]:
            pytest.skip(failures[key])
        return found

    return make


@pytest.mark.parametrize(
    "arch, kind",
    [(a, "nf4") for a in MOE] + [(a, "fp4-double") for a in MIXTRAL],
    ids=lambda v: getattr(v, "stock_model_type", v),
)
def test_disk_experts_of_a_4bit_checkpoint_are_read_in_their_stored_form(arch, kind, four_bit_folder, tmp_path):
    cls, fp32_folder, folder, whole = four_bit_folder(arch, kind)
    placed, left = loaded_leaving_odd_experts(cls, folder, whole, tmp_path)
    device_map = placed.hf_device_map
    for expert in left:
        assert any(name.endswith(".weight.absmax") for name in expert.sources)
    # A miss reads the packed data, an eighth of the fp32 checkpoint's weights, and a little state beside it.
    fp32 = cls.from_pretrained(fp32_folder, device_map=device_map)
    weights = sum(s.nbytes for name, s in _left(fp32)[0].sources.items() if name.endswith("weight"))
    data = sum(s.nbytes for name, s in left[0].sources.items() if name.endswith("weight"))
    assert data * 8 == weights and left[0].read_bytes < 0.2 * _left(fp32)[0].read_bytes
    inputs = causal_text_sample(whole.config, "MixtralForCausalLM")
    assert _max_diff(whole, placed, inputs) <= 1e-5
    ids = inputs["input_ids"][:1, :6]
    # Weights left in the folder's map are on a 64-byte boundary (the state's odd sizes misalign the rest, which is
    # copied): kernels sum a one-row product in another order on misaligned data, and greedy tokens then part.
    resident = [t for t in placed.parameters() if t.device.type == "cpu"]
    assert all(t.untyped_storage().resizable() or t.data_ptr() % 64 == 0 for t in resident)
    assert _max_diff(whole, placed, {"input_ids": ids[:, :1]}) == 0
    cache = placed.expert_cache
    kept = {layer: len(cache.cached_experts(layer)) for layer in cache.layers}
    want = whole.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(placed.generate(ids, max_new_tokens=6, do_sample=False), want)
    stats, sizes = cache.stats, [e.read_bytes for e in cache.experts.values()]
    assert stats.misses and stats.misses * min(sizes) <= stats.bytes_read <= stats.misses * max(sizes)
    # The default budget holds what the map placed, each layer as many experts (double quantization's state differs
    # by a few bytes from expert to expert), and a cached expert holds no read buffer its weights left behind
    # (bitsandbytes repacks a 4-bit weight at its first call on a CPU with AVX-512 BF16).
    assert {layer: len(cache.cached_experts(layer)) for layer in cache.layers} == kept
    for expert in (e for e in cache.experts.values() if e.materialized):
        held = {t.untyped_storage().data_ptr() for p in expert.module.parameters() for t in leaf_tensors(p)}
        assert all(buffer.data_ptr() in held for buffer in expert.owned.values())


@pytest.mark.parametrize("arch", MIXTRAL, ids=lambda arch: arch.stock_model_type)
def test_auto_caches_4bit_experts_in_their_stored_bytes(arch, four_bit_folder):
    cls, _, folder, whole = four_bit_folder(arch)
    experts = [p for n, p in whole.named_parameters() if ".experts." in n]
    size, expert_bytes = sum(held_bytes(p) for p in whole.parameters()), sum(held_bytes(p) for p in experts)
    placed = cls.from_pretrained(folder, device_map="auto", max_memory={"cpu": size - expert_bytes // 2}).eval()
    disk = [name for name, device in placed.hf_device_map.items() if device == "disk"]
    assert disk and all(".experts." in name for name in disk)
    inputs = causal_text_sample(whole.config, "MixtralForCausalLM")
    ids = inputs["input_ids"][:1, :6]
    assert torch.equal(
        placed.generate(ids, max_new_tokens=8, do_sample=False), whole.generate(ids, max_new_tokens=8, do_sample=False)
    )
    cache = placed.expert_cache
    assert cache.stats.evictions and cache.bytes_cached <= cache.budget
    # A 4-bit weight holds its quantization state too, and the budget leaves room for it in max_memory.
    weight = next(p for n, p in placed.named_parameters() if n.endswith("q_proj.weight"))
    assert held_bytes(weight) > weight.numel() * weight.element_size()
    managed = {id(p) for e in cache.experts.values() for p in e.module.parameters()}
    resident = sum(held_bytes(p) for p in placed.parameters() if id(p) not in managed and p.device.type == "cpu")
    assert resident + cache.budget <= size - expert_bytes // 2


@pytest.mark.parametrize("arch", MIXTRAL, ids=lambda arch: arch.stock_model_type)
def test_a_model_with_4bit_experts_on_disk_saves_them_as_stored(arch, four_bit_folder, tmp_path):
    """Cached experts too: bitsandbytes repacks a 4-bit weight it runs on a CPU with AVX-512 BF16, and unpacks it to
    save with its scales rounded to bf16; the experts are written from the checkpoint instead, bit for bit."""
    cls, _, folder, whole = four_bit_folder(arch)
    placed = cls.from_pretrained(folder, device_map=_odd_experts_on_disk(whole)).eval()
    inputs = causal_text_sample(whole.config, "MixtralForCausalLM")
    with torch.no_grad():
        placed(**inputs)  # some experts cached now, others on meta
    assert _left(placed) and len(_left(placed)) < len(placed.expert_cache.experts)
    with pytest.warns(UserWarning, match="offloaded modules"):
        placed.save_pretrained(tmp_path / "resaved")
    with (
        safe_open(folder / "model.safetensors", "pt") as a,
        safe_open(tmp_path / "resaved/model.safetensors", "pt") as b,
    ):
        assert set(a.keys()) == set(b.keys())
        experts = [key for key in a.keys() if ".experts." in key]
        assert experts and all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in experts)
    resaved = cls.from_pretrained(tmp_path / "resaved").eval()
    ids = inputs["input_ids"][:1, :6]
    assert resaved.generate(ids, max_new_tokens=4, do_sample=False).shape == (1, 10)


@pytest.mark.parametrize("arch", MIXTRAL, ids=lambda arch: arch.stock_model_type)
def test_an_8bit_checkpoint_with_experts_on_disk_is_refused_as_transformers_refuses_it(arch, converted, tmp_path):
    """bitsandbytes' 8-bit weights keep outlier columns in full precision at run time: not served from disk."""
    cls = _causal_lm(arch)
    _, dst = converted(arch.stock_model_type, stock_class_name(cls), **wide(arch))
    model = cls.from_pretrained(dst, quantization_config=transformers.BitsAndBytesConfig(load_in_8bit=True))
    model.save_pretrained(tmp_path / "eight-bit")
    with pytest.raises(ValueError, match="dispatched on the CPU or the disk"):
        cls.from_pretrained(tmp_path / "eight-bit", device_map=_odd_experts_on_disk(model))


@pytest.mark.parametrize("arch", MIXTRAL, ids=lambda arch: arch.stock_model_type)
def test_the_memory_a_repack_frees_is_given_back_past_a_bound(arch, four_bit_folder, monkeypatch):
    """bitsandbytes repacks a 4-bit weight at its first call on a CPU with AVX-512 BF16; the cache keeps the read
    buffer it leaves for the layer's next read, and has glibc give back the freed heap past KEPT_FREED_BYTES."""
    cls, _, folder, whole = four_bit_folder(arch)
    placed = cls.from_pretrained(folder, device_map=_odd_experts_on_disk(whole)).eval()
    trims = []
    monkeypatch.setattr(expert_cache, "KEPT_FREED_BYTES", -1)
    monkeypatch.setattr(expert_cache, "return_freed_memory", lambda: trims.append(1))
    ids = causal_text_sample(whole.config, "MixtralForCausalLM")["input_ids"][:1, :6]
    placed.generate(ids, max_new_tokens=4, do_sample=False)
    cache = placed.expert_cache
    repacked = [e for e in cache.experts.values() if e.materialized and _repacked(e.module)]
    if not repacked:
        pytest.skip("bitsandbytes does not repack 4-bit weights on this CPU")
    stored = set(repacked[0].sources)  # one expert's worth per layer at most
    assert trims and cache.replaced and all(set(kept) <= stored for kept in cache.replaced.values())


def _repacked(expert) -> bool:
    return any(getattr(getattr(p, "quant_state", None), "packing_format_for_cpu", False) for p in expert.parameters())
