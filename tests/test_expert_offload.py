"""Experts bigger than memory: experts a device_map offloads are read from the checkpoint's own files (nothing
written at load), kept in a byte-budgeted per-layer LRU cache, optionally read ahead; results never change; a
checkpoint file of offloaded experts removed or truncated under a running model is a clear error naming it;
training is refused.
Every MoE architecture of the table (a row whose model has `MixtureOfExperts` layers) runs the model-level tests."""

import os
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.inputs import causal_text_sample
from fivefold.modeling.expert_cache import ExpertCache
from fivefold.modeling.expert_eviction import FrequencyEviction, eviction_named
from fivefold.modeling.expert_offload import OffloadedTraining
from fivefold.modeling.expert_placement import DeviceCosts, compute_on_cpu
from fivefold.modeling.expert_store import ExpertReadError, FileTensor, MemoryTensor, read_header
from fivefold.modeling.moe import MixtureOfExperts, MoESpec
from fivefold.modeling.offloaded_expert import OffloadedExpert


def _causal_lm(arch):
    return next((cls for auto, cls in arch.models.items() if auto == "AutoModelForCausalLM"), None)


def _is_moe(arch) -> bool:
    cls = _causal_lm(arch)
    if cls is None:
        return False
    with torch.device("meta"):
        model = cls(arch.config_class(**arch.tiny))
    return any(isinstance(m, MixtureOfExperts) for m in model.modules())


MOE = [arch for arch in ARCHITECTURES if _is_moe(arch)]


@pytest.fixture(params=MOE, ids=lambda arch: arch.stock_model_type)
def moe_folder(request, converted):
    arch = request.param
    cls = _causal_lm(arch)
    _, dst = converted(arch.stock_model_type, stock_class_name(cls))
    return arch, cls, dst


def _on_disk(model, disk: set[str]) -> dict[str, str]:
    """A device map with the named modules on disk and everything else on the CPU (in disjoint subtrees, as
    accelerate wants them)."""
    device_map = {}

    def place(module, name):
        if name in disk:
            device_map[name] = "disk"
        elif not any(d.startswith(f"{name}." if name else "") for d in disk):
            device_map[name] = "cpu"
        else:
            for child, sub in module.named_children():
                place(sub, f"{name}.{child}" if name else child)

    place(model, "")
    return device_map


def _odd_experts_on_disk(model) -> dict[str, str]:
    """Everything on the CPU, except every odd-numbered expert of every MoE layer, on disk."""
    disk = set()
    for name, module in model.named_modules():
        if isinstance(module, MixtureOfExperts):
            disk.update(f"{name}.experts.{e}" for e in range(1, len(module.experts), 2))
    return _on_disk(model, disk)


def quantized_checkpoints(converted, tmp_path_factory, config_of, overrides_of=lambda arch: {}):
    """A maker of (class, the fp32 folder, the quantized folder, the quantized model whole) for an architecture and
    a kind of quantization, made once each: the tiny checkpoint (with `overrides_of(arch)`) converted, loaded with
    `config_of(kind)` and saved."""
    cache = {}

    def make(arch, kind: str):
        key = (arch.stock_model_type, kind)
        if key not in cache:
            cls = _causal_lm(arch)
            _, dst = converted(arch.stock_model_type, stock_class_name(cls), **overrides_of(arch))
            folder = tmp_path_factory.mktemp(f"{arch.stock_model_type}-{kind}") / "quantized"
            cls.from_pretrained(dst, quantization_config=config_of(kind)).save_pretrained(folder)
            cache[key] = (cls, dst, folder, cls.from_pretrained(folder).eval())
        return cache[key]

    return make


def loaded_leaving_odd_experts(cls, folder, whole, tmp_path) -> tuple:
    """(the model, its experts left in the checkpoint): `folder` (a quantized one) loaded with every odd-numbered
    expert on "disk", checked to leave exactly those unread, reported nowhere as missing, and to write nothing."""
    device_map = _odd_experts_on_disk(whole)
    placed, info = cls.from_pretrained(
        folder, device_map=device_map, offload_folder=tmp_path / "offload", output_loading_info=True
    )
    assert not info["missing_keys"]  # the experts left in the checkpoint are not reported missing
    assert not (tmp_path / "offload").exists() or not any((tmp_path / "offload").iterdir())  # nothing written
    left = _left(placed)
    assert len(left) == sum(1 for device in device_map.values() if device == "disk")
    assert placed.hf_device_map == device_map
    for expert in left:
        assert all(p.device.type == "meta" for p in expert.module.parameters())  # nothing read at load
    return placed.eval(), left


def _left(model) -> list:
    """The experts the cache serves that are not on their device now."""
    return [e for e in model.expert_cache.experts.values() if not e.materialized]


def _max_diff(a, b, inputs) -> float:
    with torch.no_grad():
        return (a(**inputs).logits - b(**inputs).logits).abs().max().item()


def _load(cls, folder, device_map, **kwargs):
    return cls.from_pretrained(folder, device_map=device_map, **kwargs).eval()


# --- the checkpoint is the offload store ------------------------------------------------------------------------


def test_disk_experts_are_read_from_the_checkpoint_and_nothing_is_written(moe_folder, tmp_path):
    _, cls, dst = moe_folder
    plain = cls.from_pretrained(dst).eval()
    offload = tmp_path / "offload"
    placed = _load(cls, dst, _odd_experts_on_disk(plain), offload_folder=offload)
    files = {s.path for e in placed.expert_cache.experts.values() for s in e.sources.values()}
    assert files and all(f.startswith(str(dst)) for f in files)
    assert not any(offload.rglob("*"))  # nothing written at load
    inputs = causal_text_sample(plain.config, "MixtralForCausalLM")
    with torch.no_grad():
        assert (plain(**inputs).logits - placed(**inputs).logits).abs().max() <= 1e-5


def test_converted_files_align_their_data_so_an_offloaded_model_keeps_resident_weights_mapped(moe_folder):
    """A converted file's data starts on a 64-byte boundary, as torch aligns its own allocations, so that the
    weights an offloaded model keeps resident stay in the file's pages instead of being copied at load."""
    _, cls, dst = moe_folder
    for file in dst.glob("*.safetensors"):
        with open(file, "rb") as f:
            assert (8 + int.from_bytes(f.read(8), "little")) % 64 == 0
    offsets = {name: entry.offset for file in dst.glob("*.safetensors") for name, entry in read_header(file).items()}
    placed = _load(cls, dst, _odd_experts_on_disk(cls.from_pretrained(dst)))
    resident = {name: t for name, t in placed.named_parameters() if t.device.type == "cpu"}
    # Every tensor of a size that allows it is aligned (gpt-oss's tiny biases do not; they are copied at load).
    aligned = {name for name in resident if offsets[name] % 64 == 0}
    assert aligned >= {name for name, t in resident.items() if t.numel() * t.element_size() % 64 == 0}
    assert {name for name, t in resident.items() if not t.untyped_storage().resizable()} == aligned


def test_disk_experts_are_not_read_at_load(moe_folder, monkeypatch):
    """The load reads the tensors that stay in memory and none of those offloaded to "disk" (transformers reads
    them all and drops the offloaded ones); the model then runs as the one loaded whole."""
    import transformers.core_model_loading as loading

    _, cls, dst = moe_folder
    plain = cls.from_pretrained(dst).eval()
    device_map = _odd_experts_on_disk(plain)
    materialize, read = loading._materialize_copy, []

    def counted(tensor, device=None, dtype=None):
        out = materialize(tensor, device, dtype)
        if out.untyped_storage().nbytes() >= out.nbytes:  # read; a stand-in holds one element for all of them
            read.append(out.nbytes)
        return out

    monkeypatch.setattr(loading, "_materialize_copy", counted)
    inputs = causal_text_sample(plain.config, "MixtralForCausalLM")
    for dtype in (None, torch.bfloat16):  # a cast at load copies no stand-in either
        read.clear()
        placed = _load(cls, dst, device_map, dtype=dtype)
        resident = sum(t.nbytes for t in [*placed.parameters(), *placed.buffers()] if t.device.type == "cpu")
        offloaded = [e for e in placed.expert_cache.experts.values() if not e.materialized]
        assert offloaded and sum(read) <= resident  # not one offloaded expert's bytes
        whole = plain if dtype is None else cls.from_pretrained(dst, dtype=dtype).eval()
        with torch.no_grad():
            assert torch.equal(whole(**inputs).logits, placed(**inputs).logits)


def test_a_buffer_on_disk_is_loaded_as_transformers_loads_it(converted, tmp_path):
    """A persistent buffer of a module the device map puts on "disk" is set on its module at load (transformers
    offloads buffers only with `offload_buffers=True`), so it is read, never stood in for."""
    (arch,) = [a for a in MOE if a.stock_model_type == "mixtral"]
    cls = _causal_lm(arch)
    _, dst = converted("mixtral", stock_class_name(cls))

    class WithBuffer(cls):
        def __init__(self, config):
            super().__init__(config)
            self.model.norm.register_buffer("calibration", torch.zeros(16))

    model = WithBuffer.from_pretrained(dst)
    model.model.norm.calibration.copy_(torch.arange(16.0))
    model.save_pretrained(tmp_path / "with-buffer")
    placed = _load(WithBuffer, tmp_path / "with-buffer", _on_disk(model, {"model.norm"}))
    assert torch.equal(placed.model.norm.calibration, torch.arange(16.0))


def test_a_stock_folder_with_disk_experts_needs_an_offload_folder(converted, tmp_path):
    src, dst = converted("mixtral", "MixtralForCausalLM")
    cls = _causal_lm(MOE[0])
    device_map = _odd_experts_on_disk(cls.from_pretrained(dst))
    with pytest.raises(ValueError, match=r"stock checkpoint, converted in memory.*fivefold convert"):
        cls.from_pretrained(src, device_map=device_map)
    placed = _load(cls, src, device_map, offload_folder=tmp_path / "offload")
    assert any((tmp_path / "offload").glob("*.safetensors"))  # transformers wrote them there
    ids = torch.tensor([[5, 17, 42, 8]])
    with torch.no_grad():
        assert (placed(ids).logits - cls.from_pretrained(dst).eval()(ids).logits).abs().max() <= 1e-5


# --- the cache on its own ---------------------------------------------------------------------------------------


def _layers_on_file(tmp_path, layers: int = 2, experts: int = 4) -> tuple[list[OffloadedExpert], list]:
    """`layers` tiny MoE layers whose experts live in one safetensors file, each released to meta."""
    torch.manual_seed(0)
    spec = MoESpec(hidden_size=8, expert_size=12, num_experts=experts, top_k=2)
    moes = [MixtureOfExperts(spec) for _ in range(layers)]
    file = tmp_path / "experts.safetensors"
    tensors = {
        f"l{i}.e{e}.{n}": p.detach().clone()
        for i, m in enumerate(moes)
        for e, x in enumerate(m.experts)
        for n, p in x.named_parameters()
    }
    save_file(tensors, file)
    header = read_header(file)
    out = []
    for i, moe in enumerate(moes):
        for e, expert in enumerate(moe.experts):
            names = [n for n, _ in expert.named_parameters()]
            sources = {n: FileTensor(file, f"l{i}.e{e}.{n}", header[f"l{i}.e{e}.{n}"]) for n in names}
            out.append(OffloadedExpert(expert, f"l{i}", e, sources, torch.device("cpu")))
            out[-1].release()
    return out, moes


def test_each_layer_evicts_its_least_recently_used_expert(tmp_path):
    experts, _ = _layers_on_file(tmp_path)
    size = experts[0].nbytes
    cache = ExpertCache(experts, budget=4 * size)  # two experts a layer
    calls = [("l0", 0), ("l0", 1), ("l1", 3), ("l0", 0), ("l0", 2), ("l1", 2), ("l1", 1)]
    for layer, index in calls:
        expert = cache.experts[(layer, index)]
        cache.acquire(expert, 1)
        cache.done(expert)
    assert cache.cached_experts("l0") == [0, 2]  # 1 was the least recently used when 2 came in
    assert cache.cached_experts("l1") == [2, 1]
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (1, 6, 2)
    assert cache.stats.bytes_read == 6 * size  # a miss reads that expert's tensors only
    assert [e.materialized for e in experts] == [True, False, True, False, False, True, True, False]


def test_frequency_eviction_keeps_popular_experts_and_lets_rare_ones_pass(tmp_path):
    experts, _ = _layers_on_file(tmp_path, layers=1, experts=6)
    size = experts[0].nbytes
    cache = ExpertCache(experts, budget=2 * size, eviction=FrequencyEviction(half_life=1000))  # two fit
    calls = [0, 1, 0, 1, 0, 1, 2, 3, 0, 4, 1, 5]  # 0 and 1 popular, 2-5 once each
    for index in calls:
        expert = cache.experts[("l0", index)]
        cache.acquire(expert, 1)
        cache.done(expert)
        assert cache.bytes_cached <= cache.budget
    assert sorted(cache.cached_experts("l0")) == [0, 1]  # the rare ones ran without evicting them
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (6, 6, 0)
    assert [e.materialized for e in experts] == [True, True, False, False, False, False]
    (tmp_path / "lru").mkdir()
    lru = ExpertCache(_layers_on_file(tmp_path / "lru", layers=1, experts=6)[0], budget=2 * size)
    for index in calls:
        expert = lru.experts[("l0", index)]
        lru.acquire(expert, 1)
        lru.done(expert)
    assert lru.stats.hits == 4 and lru.cached_experts("l0") == [1, 5]  # least recently used: each rare one evicts


def test_an_unknown_eviction_policy_is_refused():
    with pytest.raises(ValueError, match="expert_cache_eviction='mru' is not a policy fivefold has: lru, frequency"):
        eviction_named("mru")


def test_the_budget_is_never_exceeded_and_hits_cost_no_read(tmp_path):
    experts, _ = _layers_on_file(tmp_path, experts=6)
    size = experts[0].nbytes
    cache = ExpertCache(experts, budget=5 * size)  # 2.5 experts a layer: two fit
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        expert = experts[int(torch.randint(len(experts), (1,), generator=generator))]
        read_before = cache.stats.bytes_read
        hit = expert.index in cache.cached[expert.layer]
        cache.acquire(expert, 1)
        assert cache.stats.bytes_read == read_before + (0 if hit else size)
        cache.done(expert)
        assert cache.bytes_cached <= cache.budget
        on_device = sum(e.nbytes for e in experts if e.materialized)
        assert on_device == cache.bytes_cached <= 4 * size
    assert cache.stats.hits + cache.stats.misses == 200 and cache.stats.hits > 0


def test_reads_ahead_evict_only_unguessed_experts_within_the_budget(tmp_path):
    experts, _ = _layers_on_file(tmp_path, experts=6)
    size = experts[0].nbytes
    cache = ExpertCache(experts, budget=6 * size)  # three experts a layer
    for index in (0, 1, 2):  # l1 caches 0, 1, 2; 0 is the least recently used
        cache.acquire(cache.experts[("l1", index)], 1)
    buffers = []

    class InlinePool:  # runs the read at once; records that its buffers came from this thread
        def submit(self, fn, into):
            buffers.append(into)
            future = Future()
            future.set_result(fn(into))
            return future

    cache.prefetch("l1", [4, 0], InlinePool())  # the likeliest first: 4 read, 0 kept, 1 evicted for it
    assert cache.cached_experts("l1") == [2, 0] and list(cache.staged) == [cache.experts[("l1", 4)]]
    assert cache.bytes_cached <= cache.budget and cache.stats.prefetched == 1
    staged = next(iter(cache.staged.values())).result()
    assert [t.data_ptr() for t in staged.values()] == [t.data_ptr() for t in buffers[0].values()]  # filled in place
    cache.acquire(cache.experts[("l1", 4)], 1)  # the read ahead becomes an entry
    assert cache.cached_experts("l1") == [2, 0, 4] and cache.stats.prefetch_used == 1
    assert cache.bytes_cached == 6 * size // 2


def test_an_evicted_experts_buffers_take_the_next_read_unless_a_user_holds_its_weights(tmp_path):
    experts, _ = _layers_on_file(tmp_path)
    cache = ExpertCache(experts, budget=4 * experts[0].nbytes)  # two experts a layer
    first, second, third, fourth = (cache.experts[("l0", i)] for i in range(4))
    for expert in (first, second):
        cache.acquire(expert, 1)
    buffers = {name: p.untyped_storage().data_ptr() for name, p in first.module.named_parameters()}
    cache.acquire(third, 1)  # evicts `first`; its buffers take the read
    assert cache.cached_experts("l0") == [1, 2] and not first.materialized
    assert {name: p.untyped_storage().data_ptr() for name, p in third.module.named_parameters()} == buffers
    for name, p in third.module.named_parameters():
        assert torch.equal(p, third.sources[name].read())
    kept = dict(second.module.named_parameters())  # a user keeps `second`'s weights, which is evicted next
    values = {name: p.clone() for name, p in kept.items()}
    cache.acquire(fourth, 1)
    assert cache.cached_experts("l0") == [2, 3]
    read = dict(fourth.module.named_parameters())
    assert all(read[n].untyped_storage().data_ptr() != p.untyped_storage().data_ptr() for n, p in kept.items())
    assert all(torch.equal(kept[name], values[name]) for name in kept)  # never overwritten
    for name, p in fourth.module.named_parameters():
        assert torch.equal(p, fourth.sources[name].read())


def _large_tensors_file(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    """Tensors of 1.5 MB and more (read directly) at offsets that are no multiple of a page."""
    tensors = {"a.small": torch.arange(7.0), "b.large": torch.randn(512, 768), "c.large": torch.randn(300, 1301)}
    save_file(tensors, tmp_path / "large.safetensors")
    return tmp_path / "large.safetensors", tensors


def _skip_without_direct_reads(file: Path) -> None:
    try:
        os.close(os.open(file, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip(f"the file system of {file.parent} refuses O_DIRECT (a test below covers that case)")


def test_direct_reads_bypass_the_page_cache_and_equal_buffered_ones(tmp_path, monkeypatch):
    from fivefold.modeling.expert_store import _PAGE

    file, tensors = _large_tensors_file(tmp_path)
    _skip_without_direct_reads(file)
    header = read_header(file)
    assert any(header[name].offset % _PAGE for name in ("b.large", "c.large"))
    flags, real_open = [], os.open
    monkeypatch.setattr(os, "open", lambda path, flag, *a: flags.append(flag) or real_open(path, flag, *a))
    for name in ("b.large", "c.large"):
        flags.clear()
        source = FileTensor(file, name, header[name])
        source.direct = True
        room = source.empty()
        assert room.numel() >= source.nbytes + header[name].offset % _PAGE
        got = source.read(into=room)
        assert torch.equal(got, tensors[name]) and got.untyped_storage().data_ptr() == room.data_ptr()
        assert source.direct and [bool(flag & os.O_DIRECT) for flag in flags] == [True]
        buffered = FileTensor(file, name, header[name])
        assert torch.equal(buffered.read(), tensors[name])
    small = FileTensor(file, "a.small", header["a.small"])
    small.direct = True
    flags.clear()
    assert torch.equal(small.read(), tensors["a.small"]) and not flags  # small tensors: buffered, through Python


def test_a_file_replaced_between_its_header_check_and_a_direct_read_is_a_clear_error(tmp_path, monkeypatch):
    file, _ = _large_tensors_file(tmp_path)
    _skip_without_direct_reads(file)
    source = FileTensor(file, "c.large")
    source.direct = True
    real_open = os.open

    def replaced_first(path, flag, *args):  # another layout renamed over the file once its header was read
        if flag & os.O_DIRECT:
            save_file({"c.large": torch.zeros(300, 1301), "a.small": torch.arange(7.0)}, tmp_path / "other")
            os.replace(tmp_path / "other", file)
        return real_open(path, flag, *args)

    monkeypatch.setattr(os, "open", replaced_first)
    with pytest.raises(ExpertReadError, match=f"{file} changed since the model was loaded: it was replaced"):
        source.read(into=source.empty())


def test_recycled_buffers_take_direct_reads_of_tensors_at_other_offsets(tmp_path):
    """Experts of 1.5 MB and more, read directly: each lies at its own offset within its first page, and a buffer
    one evicted expert leaves serves the next, whatever its offset."""
    torch.manual_seed(0)
    spec = MoESpec(hidden_size=512, expert_size=520, num_experts=4, top_k=2)
    moe = MixtureOfExperts(spec)
    tensors = {f"e{e}.{n}": p.detach().clone() for e, x in enumerate(moe.experts) for n, p in x.named_parameters()}
    for e in range(len(moe.experts)):  # after each expert (names in order), shifting the next within its page
        tensors[f"e{e}.zpad"] = torch.arange(3.0 + e)
    save_file(tensors, tmp_path / "experts.safetensors")
    _skip_without_direct_reads(tmp_path / "experts.safetensors")
    header = read_header(tmp_path / "experts.safetensors")
    experts = []
    for e, expert in enumerate(moe.experts):
        sources = {n: FileTensor(tmp_path / "experts.safetensors", f"e{e}.{n}", header[f"e{e}.{n}"]) for n, _ in
                   expert.named_parameters()}  # fmt: skip
        for source in sources.values():
            source.direct = True
        experts.append(OffloadedExpert(expert, "l0", e, sources, torch.device("cpu")))
        experts[-1].release()
    assert len({s.entry.offset % 4096 for e in experts for s in e.sources.values()}) > 1
    assert min(s.nbytes for e in experts for s in e.sources.values()) >= 1 << 20  # read directly
    cache = ExpertCache(experts, budget=experts[0].nbytes)  # one expert at a time: every miss after the first evicts
    storages = set()
    for index in (0, 1, 2, 3, 1, 0):
        expert = cache.experts[("l0", index)]
        cache.acquire(expert, 1)
        for name, p in expert.module.named_parameters():
            assert torch.equal(p, tensors[f"e{index}.{name}"])
            storages.add(p.untyped_storage().data_ptr())
        del p  # a weight still referenced here would (rightly) keep its buffer from being reused
        cache.done(expert)
    assert cache.stats.misses == 6 and len(storages) == len(experts[0].sources)  # one expert's buffers, reused


def test_a_file_system_refusing_direct_reads_is_read_through_the_page_cache(tmp_path, monkeypatch):
    import errno

    file, tensors = _large_tensors_file(tmp_path)
    real_open = os.open

    def no_direct(path, flag, *args):
        if flag & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flag, *args)

    monkeypatch.setattr(os, "open", no_direct)
    source = FileTensor(file, "c.large")
    source.direct = True
    assert torch.equal(source.read(into=source.empty()), tensors["c.large"])
    assert not source.direct  # asked once


def test_generation_is_identical_when_every_expert_tensor_is_read_directly(moe_folder, monkeypatch):
    from fivefold.modeling import expert_store

    monkeypatch.setattr(expert_store, "_OWN_PAGES", 0)  # the tiny experts' tensors too
    reads, real_preadv = [], os.preadv
    monkeypatch.setattr(os, "preadv", lambda *args: reads.append(1) or real_preadv(*args))
    _, cls, dst = moe_folder
    _skip_without_direct_reads(next(Path(dst).glob("*.safetensors")))
    plain = cls.from_pretrained(dst).eval()
    placed = _load(cls, dst, _odd_experts_on_disk(plain), expert_cache_bytes="1KB")  # misses on every call
    inputs = causal_text_sample(plain.config, "MixtralForCausalLM")
    with torch.no_grad():
        assert torch.equal(plain(**inputs).logits, placed(**inputs).logits)
        want = plain.generate(**inputs, max_new_tokens=4, do_sample=False)
        assert torch.equal(placed.generate(**inputs, max_new_tokens=4, do_sample=False), want)
    assert reads and placed.expert_cache.stats.misses > 0


def test_a_budget_of_zero_reads_every_call_and_keeps_nothing(tmp_path):
    experts, _ = _layers_on_file(tmp_path)
    cache = ExpertCache(experts, budget=0)
    for expert in experts[:3] * 2:
        assert cache.acquire(expert, 1) == torch.device("cpu") and expert.materialized
        cache.done(expert)
        assert not expert.materialized
    assert (cache.stats.hits, cache.stats.misses) == (0, 6)


def test_compute_where_the_expert_lives_by_token_count_and_sizes(tmp_path):
    costs = DeviceCosts(cpu_flops=1e9, transfer_bytes=1e9)  # a fake machine: moving a byte = one CPU flop
    assert compute_on_cpu(tokens=1, weight_bytes=4000, flops_per_token=2000, costs=costs)
    assert not compute_on_cpu(tokens=2, weight_bytes=4000, flops_per_token=2000, costs=costs)
    experts, _ = _layers_on_file(tmp_path)
    in_memory, on_disk = experts[0], experts[1]
    in_memory.sources = {name: MemoryTensor(source.read()) for name, source in in_memory.sources.items()}
    for expert in (in_memory, on_disk):
        expert.device = torch.device("cuda")  # an accelerator that is never touched: the calls stay on the CPU
    cheap_cpu = DeviceCosts(cpu_flops=1e15, transfer_bytes=1.0)
    cache = ExpertCache(experts, budget=10 * in_memory.nbytes, costs=cheap_cpu)
    assert cache.acquire(in_memory, tokens=3) == torch.device("cpu")
    assert next(in_memory.module.parameters()).device.type == "cpu" and cache.stats.cpu_calls == 1
    cache.done(in_memory)
    assert not in_memory.materialized and cache.cached_experts("l0") == []  # not cached: it never reached the device
    # Read from disk: computed on the CPU where the cache would not keep it, else moved, its next calls hits.
    off = ExpertCache(experts, budget=0, costs=cheap_cpu)
    assert off.acquire(on_disk, tokens=3) == torch.device("cpu") and off.stats.cpu_calls == 1
    off.done(on_disk)
    moved_to = []
    on_disk.materialize = lambda tensors, device, buffers=None: moved_to.append(device)
    assert cache.acquire(on_disk, tokens=3) == torch.device("cuda") and moved_to == [torch.device("cuda")]
    assert cache.cached_experts("l0") == [1] and cache.stats.cpu_calls == 1


def test_an_expert_call_interrupted_is_released_at_the_next_call(tmp_path):
    """An exception in an expert's forward skips `done`: the expert read for that call alone must not stay held
    (and then be cached while marked for release, running as meta after)."""
    experts, moes = _layers_on_file(tmp_path, layers=1)
    cache = ExpertCache(experts, budget=2 * experts[0].nbytes, eviction=FrequencyEviction(half_life=1000))
    x = torch.randn(3, 8)
    with torch.no_grad():
        for index in (0, 2, 0, 2):  # 0 and 2 popular and cached: a third expert is read for its call only
            cache.acquire(experts[index], 3), cache.done(experts[index])
        cache.acquire(experts[1], 3)  # its forward raises here: no `done`
        assert experts[1].materialized and cache.transient == {experts[1]}
        cache.acquire(experts[3], 3)
        assert not experts[1].materialized and cache.transient == {experts[3]}
        cache.done(experts[3])
        for index in (1, 1, 1, 1):  # now popular enough to be cached; every call runs real weights
            cache.acquire(experts[index], 3)
            assert experts[index].materialized and torch.isfinite(moes[0].experts[index](x)).all()
            cache.done(experts[index])
    assert cache.bytes_cached == sum(e.nbytes for e in experts if e.materialized) <= cache.budget


def test_experts_read_under_inference_mode_serve_later_calls_with_autograd_on(tmp_path):
    """Pipelines run under `torch.inference_mode`: what a miss or a read ahead allocates is kept past the call,
    and must not be inference tensors, which a later call with autograd on (a loss in eval mode) cannot save."""
    experts, moes = _layers_on_file(tmp_path, layers=1)
    cache = ExpertCache(experts, budget=4 * experts[0].nbytes)

    class InlinePool:
        def submit(self, fn, into):
            future = Future()
            future.set_result(fn(into))
            return future

    with torch.inference_mode():
        cache.acquire(experts[0], 1), cache.done(experts[0])
        cache.prefetch("l0", [1], InlinePool())
        cache.acquire(experts[1], 1), cache.done(experts[1])
    x = torch.randn(2, 8, requires_grad=True)
    for index in (0, 1):
        cache.acquire(experts[index], 2)  # a hit: the weights read under inference mode
        assert not any(p.is_inference() for p in moes[0].experts[index].parameters())
        moes[0].experts[index](x).sum().backward()
        cache.done(experts[index])
    assert x.grad is not None and cache.stats.hits == 2


def test_a_read_ahead_that_fails_gives_its_reservation_back(tmp_path):
    experts, _ = _layers_on_file(tmp_path, layers=1)
    cache = ExpertCache(experts, budget=4 * experts[0].nbytes)

    class FailingPool:
        def submit(self, fn, into):
            future = Future()
            future.set_exception(ExpertReadError("the disk failed"))
            return future

    cache.prefetch("l0", [0, 1], FailingPool())
    assert cache.used["l0"] == 2 * experts[0].nbytes  # reserved while they are read
    with pytest.raises(ExpertReadError, match="the disk failed"):
        cache.acquire(experts[0], 1)  # the layer runs a guessed expert: its read's error is the call's
    with pytest.raises(ExpertReadError, match="the disk failed"):
        cache.prefetch("l0", [2], FailingPool())  # the other, unused, settles as the layer's next reads start
    assert cache.used["l0"] == cache.bytes_cached == sum(e.nbytes for e in experts if e.materialized) == 0
    cache.acquire(experts[2], 1)  # and the whole share is there again
    cache.acquire(experts[3], 1)
    assert cache.cached_experts("l0") == [2, 3] and cache.stats.evictions == 0


# --- results never change -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def expected_generations():
    """Each folder's generations held whole in memory, computed once: {(folder, options): tokens}."""
    return {}


GREEDY, BEAMS, SAMPLED = dict(do_sample=False), dict(num_beams=2, do_sample=False), dict(do_sample=True, top_k=5)


@pytest.mark.parametrize(
    ("setting", "modes"),
    [(dict(expert_cache_bytes=0), [GREEDY]), ({}, [GREEDY, BEAMS, SAMPLED]), (dict(expert_prefetch=True), [GREEDY])],
    ids=["cache-off", "cache", "prefetch"],
)
def test_generation_is_identical_with_the_cache_off_on_and_prefetching(
    moe_folder, expected_generations, setting, modes
):
    _, cls, dst = moe_folder
    plain = cls.from_pretrained(dst).eval()
    placed = _load(cls, dst, _odd_experts_on_disk(plain), **setting)
    inputs = causal_text_sample(plain.config, "MixtralForCausalLM")  # a left-padded batch of prompts
    with torch.no_grad():
        assert (plain(**inputs).logits - placed(**inputs).logits).abs().max() <= 1e-5
        for options in modes:
            key = (dst, tuple(options.items()))
            if key not in expected_generations:
                torch.manual_seed(0)
                expected_generations[key] = plain.generate(**inputs, max_new_tokens=5, **options)
            torch.manual_seed(0)
            assert torch.equal(placed.generate(**inputs, max_new_tokens=5, **options), expected_generations[key])
    stats = placed.expert_cache.stats
    assert stats.misses > 0 and placed.expert_cache.bytes_cached <= placed.expert_cache.budget
    if setting.get("expert_prefetch"):
        moe_layers = sum(isinstance(m, MixtureOfExperts) for m in plain.modules())
        if moe_layers > 1:  # a layer reads ahead for the next MoE layer
            assert stats.prefetched > 0 and 0 < stats.prefetch_accuracy <= 1
        else:  # one MoE layer among dense ones (the tiny Qwen rows): nothing comes after it to read ahead for
            assert stats.prefetched == 0


def test_the_default_budget_is_what_max_memory_leaves_after_the_resident_parts(moe_folder):
    _, cls, dst = moe_folder
    sizes = cls.from_pretrained(dst)
    total = sum(p.numel() * p.element_size() for p in sizes.parameters())
    placed = _load(cls, dst, "auto", max_memory={"cpu": float(total * 3 // 4)})  # accelerate's numbers: floats too
    cache = placed.expert_cache
    assert cache is not None and cache.budget >= sum(e.nbytes for e in cache.experts.values() if e.materialized)
    tensors = [*placed.named_parameters(), *placed.named_buffers()]
    resident = sum(t.numel() * t.element_size() for n, t in tensors if t.device.type == "cpu" and ".experts." not in n)
    assert cache.budget == max(total * 3 // 4 - resident, cache.bytes_cached)


def test_auto_keeps_every_module_but_experts_resident_and_the_experts_share_the_rest(moe_folder):
    """device_map="auto" on the CPU: every module but the experts stays in memory (transformers' own map sends
    the last layers whole and the LM head to "disk"), the experts share what max_memory leaves, each layer as many;
    a max_memory the other modules alone overflow gets transformers' own map."""
    _, cls, dst = moe_folder
    whole = cls.from_pretrained(dst).eval()
    size = sum(p.numel() * p.element_size() for p in whole.parameters())
    expert_bytes = sum(p.numel() * p.element_size() for n, p in whole.named_parameters() if ".experts." in n)
    placed = _load(cls, dst, "auto", max_memory={"cpu": size - expert_bytes + expert_bytes // 2})
    disk = [name for name, device in placed.hf_device_map.items() if device == "disk"]
    assert disk and all(".experts." in name for name in disk)
    layers = [m for m in placed.modules() if isinstance(m, MixtureOfExperts)]
    per_layer = [sum(next(e.parameters()).device.type != "meta" for e in layer.experts) for layer in layers]
    assert max(per_layer) - min(per_layer) <= 1 and 0 < sum(per_layer) < sum(len(m.experts) for m in layers)
    assert placed.expert_cache.budget <= expert_bytes // 2
    assert _max_diff(whole, placed, causal_text_sample(whole.config, "MixtralForCausalLM")) <= 1e-5
    overflowing = _load(cls, dst, "auto", max_memory={"cpu": (size - expert_bytes) // 2})
    assert any(".experts." not in name for name, d in overflowing.hf_device_map.items() if d == "disk")


def test_the_budget_is_a_config_field_saved_with_the_model(moe_folder, tmp_path):
    _, cls, dst = moe_folder
    model = cls.from_pretrained(dst, expert_cache_bytes="1MB", expert_prefetch=True)
    model.save_pretrained(tmp_path / "saved")
    config = type(model.config).from_pretrained(tmp_path / "saved")
    assert (config.expert_cache_bytes, config.expert_prefetch) == ("1MB", True)


# --- faults -------------------------------------------------------------------------------------------------------


def _expert_alone_in_a_file(folder) -> tuple[str, str]:
    """A checkpoint file that holds one expert's tensors only, and that expert (its module name)."""
    for file in sorted(folder.glob("*.safetensors")):
        experts = {name.rpartition(".")[0].rpartition(".")[0] for name in read_header(file)}
        if len(experts) == 1 and ".experts." in (expert := experts.pop()):
            return str(file), expert
    raise AssertionError("no shard holds one expert alone")


@pytest.mark.parametrize("fault", ["removed", "truncated"])
def test_a_checkpoint_file_changed_mid_generation_is_a_clear_error_naming_it(moe_folder, tmp_path, fault):
    _, cls, dst = moe_folder
    plain = cls.from_pretrained(dst)
    plain.save_pretrained(tmp_path / "sharded", max_shard_size="6KB")  # about one tensor a shard
    file, expert = _expert_alone_in_a_file(tmp_path / "sharded")
    # Only that expert on disk, read at every call: the files of the resident weights stay as they were.
    model = _load(cls, tmp_path / "sharded", _on_disk(plain, {expert}), expert_cache_bytes=0)
    ids = torch.arange(3, 40).view(1, -1) % plain.config.vocab_size
    with torch.no_grad():
        model(ids)
        if fault == "removed":
            os.remove(file)
        else:
            os.truncate(file, os.path.getsize(file) - 100)
        with pytest.raises(ExpertReadError, match=f"{file} (was removed|is truncated)"):
            model(ids)  # every token of a long prompt: each expert is chosen


def test_training_with_offloaded_experts_is_refused(moe_folder):
    _, cls, dst = moe_folder
    plain = cls.from_pretrained(dst)
    placed = _load(cls, dst, _odd_experts_on_disk(plain)).train()
    ids = torch.arange(3, 40).view(1, -1) % plain.config.vocab_size
    with pytest.raises(OffloadedTraining, match="offloaded"):
        placed(ids, labels=ids)
