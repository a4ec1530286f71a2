"""Quantized experts bigger than memory: a torchao-quantized checkpoint (`save_pretrained` of a model loaded with
`TorchAoConfig`) loads with its experts on "disk" (transformers refuses it), each read from the checkpoint when it
runs in its stored form (int8: a quarter of an fp32 expert's bytes), cached and evicted in those bytes; outputs
equal the quantized model loaded whole; only experts may be left on disk; the model saves as it is stored."""

import pytest
import torch
import transformers

from fivefold.conversion.inputs import causal_text_sample
from fivefold.modeling.expert_store import FileTensor, read_header
from fivefold.modeling.moe import MixtureOfExperts
from fivefold.modeling.quantization import QuantizationError
from fivefold.modeling.quantized_experts import held_bytes

torchao = pytest.importorskip("torchao")
from test_expert_offload import (  # noqa: E402
    MOE,
    _left,
    _max_diff,
    _odd_experts_on_disk,
    _on_disk,
    loaded_leaving_odd_experts,
    quantized_checkpoints,
)
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig  # noqa: E402

CONFIGS = {"int8-weight": Int8WeightOnlyConfig, "int8-dynamic": Int8DynamicActivationInt8WeightConfig}


@pytest.fixture(scope="module")
def quantized_folder(converted, tmp_path_factory):
    """Per architecture and config: (class, the fp32 folder, the quantized folder, the quantized model whole)."""
    make = quantized_checkpoints(converted, tmp_path_factory, lambda kind: transformers.TorchAoConfig(CONFIGS[kind]()))
    return lambda arch, kind="int8-weight": make(arch, kind)


@pytest.mark.parametrize("arch", MOE, ids=lambda arch: arch.stock_model_type)
def test_disk_experts_of_a_quantized_checkpoint_are_read_in_their_stored_form(arch, quantized_folder, tmp_path):
    cls, fp32_folder, folder, whole = quantized_folder(arch)
    placed, left = loaded_leaving_odd_experts(cls, folder, whole, tmp_path)
    device_map = placed.hf_device_map
    for expert in left:
        assert all(s.path.startswith(str(folder)) for s in expert.sources.values())
        assert any(name.endswith("._weight_qdata") for name in expert.sources)
    # A miss reads the int8 data, a quarter of what the fp32 checkpoint's expert reads, and a scale per row.
    fp32 = cls.from_pretrained(fp32_folder, device_map=device_map)
    fp32_bytes = _left(fp32)[0].read_bytes
    weights = sum(s.nbytes for name, s in _left(fp32)[0].sources.items() if name.endswith("weight"))
    data = sum(s.nbytes for name, s in left[0].sources.items() if name.endswith("_qdata"))
    assert data * 4 == weights and left[0].read_bytes == left[0].nbytes < 0.4 * fp32_bytes
    inputs = causal_text_sample(whole.config, "MixtralForCausalLM")
    assert _max_diff(whole, placed, inputs) <= 1e-5
    placed.expert_cache.reset_stats()
    ids = inputs["input_ids"][:1, :6]
    same = placed.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(same, whole.generate(ids, max_new_tokens=6, do_sample=False))
    stats = placed.expert_cache.stats
    assert stats.misses and stats.bytes_read == stats.misses * left[0].read_bytes  # a miss reads its expert only
    # A read-back weight is torchao's tensor, its int8 data where torch's int8 kernel takes it.
    expert = left[0]
    placed.expert_cache.acquire(expert, 1)
    weight = next(p for name, p in expert.module.named_parameters() if name.endswith("weight"))
    assert type(weight).__name__ == "Int8Tensor" and weight.qdata.data_ptr() % 64 == 0
    placed.expert_cache.done(expert)


def test_dynamic_int8_experts_on_disk(quantized_folder):
    (arch,) = [a for a in MOE if a.stock_model_type == "mixtral"]
    cls, _, folder, whole = quantized_folder(arch, "int8-dynamic")
    placed = cls.from_pretrained(folder, device_map=_odd_experts_on_disk(whole)).eval()
    assert _left(placed)
    inputs = causal_text_sample(whole.config, "MixtralForCausalLM")
    assert _max_diff(whole, placed, inputs) <= 1e-5


def test_auto_keeps_all_but_experts_resident_and_caches_experts_in_quantized_bytes(quantized_folder):
    """device_map="auto" with max_memory: every module but the experts stays, the experts share what is left
    (each layer as many), and the cache's budget counts stored bytes, never exceeded."""
    (arch,) = [a for a in MOE if a.stock_model_type == "mixtral"]
    cls, _, folder, whole = quantized_folder(arch)
    experts = [p for n, p in whole.named_parameters() if ".experts." in n]
    size, expert_bytes = sum(held_bytes(p) for p in whole.parameters()), sum(held_bytes(p) for p in experts)
    max_memory = size - expert_bytes + expert_bytes // 4
    placed = cls.from_pretrained(folder, device_map="auto", max_memory={"cpu": max_memory}).eval()
    disk = [name for name, device in placed.hf_device_map.items() if device == "disk"]
    assert disk and all(".experts." in name for name in disk)
    layers = [m for m in placed.modules() if isinstance(m, MixtureOfExperts)]
    per_layer = [sum(e.down_proj.weight.device.type != "meta" for e in layer.experts) for layer in layers]
    assert len(set(per_layer)) == 1 and 0 < per_layer[0] < len(layers[0].experts)
    cache = placed.expert_cache
    assert cache.budget <= expert_bytes // 4 + 1
    inputs = causal_text_sample(whole.config, "MixtralForCausalLM")
    ids = inputs["input_ids"][:1, :6]
    assert torch.equal(
        placed.generate(ids, max_new_tokens=8, do_sample=False), whole.generate(ids, max_new_tokens=8, do_sample=False)
    )
    assert cache.stats.evictions and cache.bytes_cached <= cache.budget
    cached = [e for e in cache.experts.values() if e.materialized]
    assert all(e.nbytes == sum(held_bytes(p) for p in e.module.parameters()) for e in cached)
    # Room for it all: nothing on disk, no cache (transformers' own "auto" would still have sent modules there).
    roomy = cls.from_pretrained(folder, device_map="auto", max_memory={"cpu": size + 1}).eval()
    assert "disk" not in roomy.hf_device_map.values() and roomy.expert_cache is None
    assert _max_diff(whole, roomy, inputs) == 0


def test_only_experts_may_be_left_on_disk(quantized_folder):
    (arch,) = [a for a in MOE if a.stock_model_type == "mixtral"]
    cls, _, folder, whole = quantized_folder(arch)
    head_on_disk = {**_on_disk(whole, {"lm_head"})}
    with pytest.raises(QuantizationError, match=r"puts 'lm_head' on \"disk\": only experts can be left on disk"):
        cls.from_pretrained(folder, device_map=head_on_disk)
    with pytest.raises(QuantizationError, match=r"max_memory gives the CPU 1,000 bytes, and the modules other than"):
        cls.from_pretrained(folder, device_map="auto", max_memory={"cpu": 1000})


def test_a_model_with_quantized_experts_on_disk_saves_as_stored(quantized_folder, tmp_path):
    """Saved with some offloaded experts cached and others not: each is written as the checkpoint stores it (read
    back one tensor at a time), and the folder loads whole with the same outputs."""
    (arch,) = [a for a in MOE if a.stock_model_type == "mixtral"]
    cls, _, folder, whole = quantized_folder(arch)
    placed = cls.from_pretrained(folder, device_map=_odd_experts_on_disk(whole)).eval()
    inputs = causal_text_sample(whole.config, "MixtralForCausalLM")
    with torch.no_grad():
        placed(**inputs)  # some experts cached now, others on meta
    assert _left(placed) and len(_left(placed)) < sum(1 for e in placed.expert_cache.experts.values())
    with pytest.warns(UserWarning, match="offloaded modules"):
        placed.save_pretrained(tmp_path / "resaved")
    assert read_header(tmp_path / "resaved" / "model.safetensors") == read_header(folder / "model.safetensors")
    resaved = cls.from_pretrained(tmp_path / "resaved").eval()
    assert _max_diff(whole, resaved, inputs) == 0


def test_a_direct_read_puts_quantized_data_on_a_64_byte_boundary(tmp_path):
    """safetensors aligns tensors to 8 bytes; a direct read lands a tensor where it lies within its page, and
    torch's int8 kernel needs 64-byte aligned data (int8.py): the data is moved back to the boundary."""
    from safetensors.torch import save_file

    data = torch.randint(-128, 127, (1024, 1040), dtype=torch.int8)  # over 1 MiB: read directly
    save_file({"a": torch.zeros(3, dtype=torch.int8), "b": data}, tmp_path / "t.safetensors")
    entry = read_header(tmp_path / "t.safetensors")["b"]
    assert entry.offset % 64  # the case at hand: not aligned in the file
    tensor = FileTensor(tmp_path / "t.safetensors", "b", entry)
    tensor.direct = tensor.aligned = True
    out = tensor.read(into=tensor.empty())
    assert torch.equal(out, data) and out.data_ptr() % 64 == 0


def test_a_stray_file_beside_the_checkpoint_is_never_read(quantized_folder, tmp_path):
    """Experts are read from the files the checkpoint names (its index, or model.safetensors), never from another
    safetensors file in its folder (a stale shard sorts first)."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    (arch,) = [a for a in MOE if a.stock_model_type == "mixtral"]
    cls, _, folder, whole = quantized_folder(arch)
    copy = tmp_path / "with-stray"
    shutil.copytree(folder, copy)
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        metadata = f.metadata()
    stale = {k: -v if v.dtype == torch.int8 else v for k, v in load_file(folder / "model.safetensors").items()}
    save_file(stale, copy / "model-00001-of-00002.safetensors", metadata=metadata)  # the same names, other weights
    inputs = causal_text_sample(whole.config, "MixtralForCausalLM")
    rest = sum(held_bytes(p) for n, p in whole.named_parameters() if ".experts." not in n)
    for device_map in (_odd_experts_on_disk(whole), "auto"):
        placed = cls.from_pretrained(copy, device_map=device_map, max_memory={"cpu": rest + 1000}).eval()
        files = {s.path for e in placed.expert_cache.experts.values() for s in e.sources.values()}
        assert files == {str(copy / "model.safetensors")}
        assert _max_diff(whole, placed, inputs) <= 1e-5


def test_auto_never_places_more_than_max_memory(quantized_folder):
    """Sized from the checkpoint's stored bytes (int8 data, scales and zero points): just above a whole number of
    experts, the resident model stays within max_memory."""
    (arch,) = [a for a in MOE if a.stock_model_type == "mixtral"]
    cls, _, folder, whole = quantized_folder(arch)
    expert = held_bytes_of(whole.model.layers[0].mlp.experts[0])
    rest = sum(held_bytes(p) for n, p in whole.named_parameters() if ".experts." not in n)
    for extra in (0, 100, expert - 1):
        max_memory = rest + 2 * expert + extra
        placed = cls.from_pretrained(folder, device_map="auto", max_memory={"cpu": max_memory})
        resident = sum(held_bytes(p) for p in placed.parameters() if p.device.type != "meta")
        assert resident == rest + 2 * expert <= max_memory and placed.expert_cache.budget <= max_memory - rest


def test_a_disk_key_without_parameters_goes_with_the_rest(quantized_folder):
    (arch,) = [a for a in MOE if a.stock_model_type == "mixtral"]
    cls, _, folder, whole = quantized_folder(arch)
    device_map = {**_odd_experts_on_disk(whole), "model.dropout": "disk"}
    placed = cls.from_pretrained(folder, device_map=device_map).eval()
    assert _left(placed)
    inputs = causal_text_sample(whole.config, "MixtralForCausalLM")
    assert _max_diff(whole, placed, inputs) <= 1e-5


def test_a_quantized_expert_held_in_memory_counts_what_it_holds():
    """An expert on "cpu" under an accelerator is read from memory as torchao holds it: the cache counts its int8
    bytes, not its shape in fp32."""
    from torchao.quantization import quantize_

    from fivefold.modeling.expert_store import MemoryTensor
    from fivefold.modeling.moe import MoESpec
    from fivefold.modeling.offloaded_expert import OffloadedExpert

    moe = MixtureOfExperts(MoESpec(hidden_size=64, expert_size=128, num_experts=2, top_k=1))
    quantize_(moe.experts, Int8WeightOnlyConfig())
    expert = moe.experts[0]
    sources = {name: MemoryTensor(p.detach()) for name, p in expert.named_parameters()}
    offloaded = OffloadedExpert(expert, "moe", 0, sources, torch.device("cpu"))
    assert offloaded.nbytes == held_bytes_of(expert) < 0.3 * sum(p.numel() * 4 for p in expert.parameters())


def held_bytes_of(module: torch.nn.Module) -> int:
    return sum(held_bytes(p) for p in module.parameters())
