"""transformers' quantizers (`from_pretrained(quantization_config=...)`) on every architecture of the table, stock
and fivefold side by side, counted the same way: the modules quantized (fivefold: every linear layer stock's
quantizer would take, its experts included, routers and output embeddings left out), the largest difference
from the unquantized model (fivefold's no worse than 1.5x stock's where both quantize the same modules), the
bytes of the quantized weights, generate(), save_pretrained and reloading where the quantizer serialises (on
Mixtral), and
loading the saved folder with stock transformers alone. A quantizer that quantizes nothing is an error.

Every architecture is quantized by torchao int8 weight-only and one more quantizer (in turn); BERT, GPT-2 and
Mixtral by every quantizer that installs here. Run with `-s` to print the table."""

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers
from torch import nn
from transformers.quantizers.base import get_keys_to_not_convert
from transformers.quantizers.quantizers_utils import should_convert_module

from fivefold.architectures import ARCHITECTURES, Architecture, stock_class_name
from fivefold.modeling.moe import MixtureOfExperts
from fivefold.modeling.quantization import NOT_QUANTIZED, QuantizationError, is_quantized_weight, quantized_modules

from helpers import RemoteJob, run_without_fivefold


def _quanto_int4_built() -> bool:
    """quanto's int4 CPU kernels are a C++ extension it compiles on first use (minutes on 2 cores)."""
    spec = importlib.util.find_spec("optimum.quanto")
    if spec is None:
        return False
    return (Path(spec.origin).parent / "library/extensions/cpp/build/pytorch_version.txt").exists()


@dataclass(frozen=True)
class Quantizer:
    package: str  # the module it needs
    bits: int
    serialises: bool  # save_pretrained of the quantized model, reloaded quantized
    # What its skip patterns are matched against: module names, or parameter names (torchao: `...wo.weight`, so that
    # a suffix pattern such as T5's `wo` in `_keep_in_fp32_modules` does not keep the module out).
    matches: str = "module"

    def config(self, name: str):
        if name.startswith("torchao"):
            from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

            kind = Int8WeightOnlyConfig if name == "torchao-int8-weight" else Int8DynamicActivationInt8WeightConfig
            return transformers.TorchAoConfig(kind())
        if name.startswith("quanto"):
            return transformers.QuantoConfig(weights=name.removeprefix("quanto-"))
        return transformers.BitsAndBytesConfig(load_in_8bit=self.bits == 8, load_in_4bit=self.bits == 4)


QUANTIZERS = {
    "torchao-int8-weight": Quantizer("torchao", 8, True, "parameter"),
    "torchao-int8-dynamic": Quantizer("torchao", 8, True, "parameter"),
    "quanto-int8": Quantizer("optimum.quanto", 8, False),
    "quanto-int4": Quantizer("optimum.quanto", 4, False),
    "bnb-8bit": Quantizer("bitsandbytes", 8, True),
    "bnb-4bit": Quantizer("bitsandbytes", 4, True),
}
EVERY_QUANTIZER = ("bert", "gpt2", "mixtral")  # an encoder, a decoder, a mixture of experts
SAVED = ("mixtral",)  # the rows saved and reloaded under every quantizer that serialises (a load each: time)
# The quantizer of each other row, in turn.
IN_TURN = ("torchao-int8-weight", "quanto-int8", "bnb-8bit", "torchao-int8-dynamic", "bnb-4bit")


def head_class(arch: Architecture) -> type:
    """The class a row quantizes: the generating head where there is one, else the base model."""
    for auto in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModel"):
        if auto in arch.models:
            return arch.models[auto]
    raise AssertionError(f"{arch.stock_model_type} has no base model")


def _cells() -> list:
    cells = []
    for index, arch in enumerate(ARCHITECTURES):
        chosen = QUANTIZERS if arch.stock_model_type in EVERY_QUANTIZER else (IN_TURN[index % len(IN_TURN)],)
        for name in chosen:
            marks = []
            if name == "quanto-int4" and not _quanto_int4_built():
                marks.append(pytest.mark.skip(reason="quanto's int4 C++ extension is not built yet (minutes)"))
            cells.append(pytest.param(arch, name, id=f"{arch.stock_model_type}-{name}", marks=marks))
    return cells


def _output(model: nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    return (out.logits if "logits" in out else out.last_hidden_state).float()


def expected_quantized(model: nn.Module, matches: str = "module") -> set[str]:
    """What a quantizer takes of an unquantized fivefold model: every linear layer but those transformers keeps
    (output embeddings, the last module, `_keep_in_fp32_modules`) and the routers."""
    keep = [*get_keys_to_not_convert(model), *(model._keep_in_fp32_modules or ()), *NOT_QUANTIZED]
    suffix = ".weight" if matches == "parameter" else ""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return {name for name in linears if should_convert_module(name + suffix, keep)}


def weight_bytes(model: nn.Module, names: list[str]) -> int:
    """The bytes the weights of these modules hold, a quantized tensor's inner tensors (data, scales) included."""

    def size(t: torch.Tensor) -> int:
        if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "__tensor_flatten__"):
            inner, _ = t.__tensor_flatten__()
            return sum(size(getattr(t, n)) for n in inner)
        return t.numel() * t.element_size()

    modules = dict(model.named_modules())
    return sum(size(modules[n].weight) for n in names)


@pytest.fixture(scope="module")
def unquantized(converted):
    """Per architecture: the checkpoint folders, the inputs and both models' unquantized outputs."""
    cache = {}

    def make(arch: Architecture):
        if arch.model_type not in cache:
            cls = head_class(arch)
            src, dst = converted(arch.stock_model_type, stock_class_name(cls))
            ours = cls.from_pretrained(dst).eval()
            inputs = arch.sample_inputs(ours.config, stock_class_name(cls), 0)
            stock = getattr(transformers, stock_class_name(cls)).from_pretrained(src).eval()
            cache[arch.model_type] = dict(
                src=src, dst=dst, cls=cls, inputs=inputs, ours=ours, stock=_output(stock, inputs)
            )
        return cache[arch.model_type]

    return make


@pytest.mark.parametrize(("arch", "name"), _cells())
def test_quantized_like_stock(unquantized, arch, name, tmp_path):
    quantizer = QUANTIZERS[name]
    pytest.importorskip(quantizer.package)
    row = unquantized(arch)
    cls, inputs = row["cls"], row["inputs"]
    stock = getattr(transformers, stock_class_name(cls)).from_pretrained(
        row["src"], quantization_config=quantizer.config(name)
    )
    ours = cls.from_pretrained(row["dst"], quantization_config=quantizer.config(name)).eval()

    got, want = quantized_modules(ours), expected_quantized(row["ours"], quantizer.matches)
    assert set(got) == want, f"not quantized: {sorted(want - set(got))}"
    stock_count = len(quantized_modules(stock))
    assert len(got) >= stock_count
    shrunk = weight_bytes(ours, got) / weight_bytes(row["ours"], got)
    assert shrunk <= (0.35 if quantizer.bits == 8 else 0.25)

    try:
        stock_out = _output(stock.eval(), inputs)
    except RuntimeError as error:  # the quantizer's own kernels, on stock's modules
        with pytest.raises(type(error)):
            _output(ours, inputs)
        pytest.skip(f"{name} fails on stock's model too on this CPU ({error}); fivefold fails the same way")
    ours_diff = (_output(ours, inputs) - _output(row["ours"], inputs)).abs().max().item()
    stock_diff = (stock_out - row["stock"]).abs().max().item()
    if len(got) == stock_count:  # the same modules quantized
        assert ours_diff <= 1.5 * stock_diff + 1e-4
    assert 0 < ours_diff < 4.0  # changed by the quantization, not broken by it
    print(
        f"\n| {arch.stock_model_type} | {name} | {stock_count} / {stock_diff:.3f} | {len(got)} / {ours_diff:.3f} "
        f"| {shrunk:.2f} |"
    )

    if cls.can_generate():
        prompt = {k: inputs[k] for k in ("input_ids", "attention_mask")}
        out = ours.generate(**prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        assert out.shape[0] == prompt["input_ids"].shape[0]
    if quantizer.serialises and arch.stock_model_type in SAVED:
        ours.save_pretrained(tmp_path / "q")
        again = cls.from_pretrained(tmp_path / "q").eval()
        assert quantized_modules(again) == got
        torch.testing.assert_close(_output(again, inputs), _output(ours, inputs), atol=0, rtol=0)


def test_experts_quantized_where_stock_keeps_them_in_fp32(unquantized):
    """Mixtral under quanto and torchao: every expert of fivefold's model quantized; stock's fused 3-D experts are
    no linear layer, and stay fp32."""
    pytest.importorskip("optimum.quanto")
    pytest.importorskip("torchao")
    row = unquantized(_arch("mixtral"))
    config = row["ours"].config
    experts = config.num_hidden_layers * config.num_local_experts * 3  # gate, up, down
    for name in ("quanto-int8", "torchao-int8-weight"):
        ours = row["cls"].from_pretrained(row["dst"], quantization_config=QUANTIZERS[name].config(name))
        assert sum(".experts." in n for n in quantized_modules(ours)) == experts
        stock = transformers.MixtralForCausalLM.from_pretrained(
            row["src"], quantization_config=QUANTIZERS[name].config(name)
        )
        fused = [p for n, p in stock.named_parameters() if ".experts." in n]
        assert fused and not any(is_quantized_weight(p) for p in fused)


def test_a_quantizer_that_quantizes_nothing_is_an_error(unquantized):
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig

    row = unquantized(_arch("bert"))
    every_linear = sorted(expected_quantized(row["ours"]))
    config = transformers.TorchAoConfig(Int8WeightOnlyConfig(), modules_to_not_convert=every_linear)
    with pytest.raises(QuantizationError, match="quantized no module"):
        row["cls"].from_pretrained(row["dst"], quantization_config=config)


@pytest.mark.parametrize("name", ["hqq", "torchao-int4-weight"])
def test_quantizers_that_fail_here_fail_for_stock_alike(unquantized, name):
    """HQQ through from_pretrained is "not available yet" in transformers 5.24; torchao 0.18's int4 weight-only
    tensors have CUDA kernels only. Both fail for stock as for fivefold, with the same exception."""
    if name == "hqq":
        pytest.importorskip("hqq")
        config = transformers.HqqConfig(nbits=4)
    else:
        pytest.importorskip("torchao")
        from torchao.quantization import Int4WeightOnlyConfig

        config = transformers.TorchAoConfig(Int4WeightOnlyConfig(group_size=32))
    row = unquantized(_arch("bert"))
    raised = []
    for cls, folder in ((getattr(transformers, stock_class_name(row["cls"])), row["src"]), (row["cls"], row["dst"])):
        with pytest.raises((NotImplementedError, RuntimeError)) as error:
            cls.from_pretrained(folder, quantization_config=config)
        raised.append(error.type)
    assert raised[0] is raised[1]


@pytest.mark.slow
def test_quantized_folders_load_with_stock_transformers_alone(unquantized, tmp_path):
    """Saved quantized (torchao on Mixtral, bitsandbytes on BERT), then loaded through trust_remote_code in a process
    that cannot import fivefold: quantized the same, the same outputs."""
    pytest.importorskip("torchao")
    pytest.importorskip("bitsandbytes")
    jobs, expected = [], []
    for model_type, name in (("mixtral", "torchao-int8-weight"), ("bert", "bnb-8bit")):
        row = unquantized(_arch(model_type))
        ours = row["cls"].from_pretrained(row["dst"], quantization_config=QUANTIZERS[name].config(name)).eval()
        ours.save_pretrained(tmp_path / model_type)
        auto_name = next(a for a, c in _arch(model_type).models.items() if c is row["cls"])
        jobs.append(RemoteJob(tmp_path / model_type, auto_name, row["inputs"]))
        expected.append(_output(ours, row["inputs"]))
    for result, want in zip(run_without_fivefold(tmp_path, jobs), expected, strict=True):
        assert not result["module"].startswith("fivefold")
        got = result["outputs"].get("logits", result["outputs"].get("last_hidden_state"))
        torch.testing.assert_close(got.float(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["bert", "llama"])
def test_a_quantized_model_cast_to_bf16_computes_in_bf16_as_stocks(unquantized, model_type, tmp_path):
    """torchao's int8 tensors keep the dtype they were quantized from through `model.to(torch.bfloat16)` and a saved
    folder's `dtype=` load: the down projections and the int8 table (with its head) must still compute in the
    model's dtype, not cast the residual stream back to fp32 (a LayerNorm then fails on mixed dtypes, as stock's
    model does not)."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig

    row = unquantized(_arch(model_type))
    config = transformers.TorchAoConfig(Int8WeightOnlyConfig(), include_input_output_embeddings=True)
    ours = row["cls"].from_pretrained(row["dst"], quantization_config=config).eval()
    ours.save_pretrained(tmp_path / "int8")
    for model in (ours.to(torch.bfloat16), row["cls"].from_pretrained(tmp_path / "int8", dtype=torch.bfloat16)):
        with torch.no_grad():
            out = model.eval()(**row["inputs"], output_hidden_states=True)
        assert {h.dtype for h in out.hidden_states} == {torch.bfloat16}
        assert (out.logits if "logits" in out else out.last_hidden_state).dtype == torch.bfloat16


def _arch(model_type: str) -> Architecture:
    return next(a for a in ARCHITECTURES if a.stock_model_type == model_type)


def test_int8_weights_run_torchs_int8_kernel(unquantized, monkeypatch):
    """torchao int8 weight-only on Mixtral through `_weight_int8pack_mm` (forced on where torch runs it scalar, and
    at every row count): every quantized linear, experts included, takes the kernel, as close to the unquantized
    model as torchao's own path (the kernel's bf16 activations round no coarser than the int8 weights)."""
    pytest.importorskip("torchao")
    from fivefold.modeling import int8

    row = unquantized(_arch("mixtral"))
    ours = (
        row["cls"]
        .from_pretrained(
            row["dst"], quantization_config=QUANTIZERS["torchao-int8-weight"].config("torchao-int8-weight")
        )
        .eval()
    )
    monkeypatch.setattr(int8, "INT8PACK_ON", False)
    reference = _output(ours, row["inputs"])
    calls = []
    kernel = int8._INT8PACK
    monkeypatch.setattr(int8, "INT8PACK_ON", True)
    monkeypatch.setattr(int8, "INT8PACK_MIN_ROWS", 1 << 20)  # every product, however many rows

    def checked(x, q, s):  # each call within bf16's rounding of the exact sums (x is bf16 already)
        y = kernel(x, q, s)
        exact, size = x.float() @ q.float().T, x.float().abs() @ q.float().abs().T
        assert ((y.float() - exact).abs() <= 2**-8 * size + 1e-6).all(), q.shape
        calls.append(q.shape)
        return y

    monkeypatch.setattr(int8, "_INT8PACK", checked)
    got = _output(ours, row["inputs"])
    unquantized = _output(row["ours"], row["inputs"])
    kernel_error = (got - unquantized).abs().max().item()
    torchao_error = (reference - unquantized).abs().max().item()
    # Not bounded by torchao's: the tiny router's near ties flip on bf16's rounding, and a flipped expert moves the
    # logits by its whole output (0.39 against torchao's 0.09 measured); each linear is checked above.
    print(f"\nint8 kernel: {kernel_error:.4f} from fp32; torchao's path: {torchao_error:.4f}")
    assert 0 < kernel_error < 4.0
    config = ours.config
    experts = config.num_hidden_layers * config.num_local_experts * 3
    assert len(calls) >= len(quantized_modules(ours)) - experts  # every attention linear, and experts chosen
    assert len(calls) > len(quantized_modules(ours)) - experts  # some expert took it


def test_dynamic_int8_runs_in_int8_and_equals_torchaos_path(unquantized, monkeypatch):
    """torchao dynamic int8 (activations quantized per row at each call) on BERT and Mixtral: every quantized
    linear takes fivefold's int8 path (`torch._int_mm` on the rounded activations), whose outputs equal torchao's
    own path bit for bit (the same scales, roundings and int32 sums)."""
    pytest.importorskip("torchao")
    from fivefold.modeling import int8

    products, fallbacks, quantized = [], [], []
    product, parts, f_linear = int8._int8_product, int8.int8_dynamic_parts, torch.nn.functional.linear
    quantize = int8._quantize_rows

    def counted(*args):
        products.append(1)
        return product(*args)

    def watched_linear(x, weight, bias=None):
        fallbacks.append(int8.int8_dynamic_parts(weight) is not None)
        return f_linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", watched_linear)
    for model_type in ("bert", "mixtral"):
        row = unquantized(_arch(model_type))
        config = QUANTIZERS["torchao-int8-dynamic"].config("torchao-int8-dynamic")
        ours = row["cls"].from_pretrained(row["dst"], quantization_config=config).eval()
        monkeypatch.setattr(int8, "int8_dynamic_parts", lambda weight: None)  # torchao's own path everywhere
        reference = _output(ours, row["inputs"])
        monkeypatch.setattr(int8, "int8_dynamic_parts", parts)
        monkeypatch.setattr(int8, "_int8_product", counted)
        monkeypatch.setattr(int8, "_quantize_rows", lambda rows: quantized.append(1) or quantize(rows))
        products.clear(), fallbacks.clear(), quantized.clear()
        got = _output(ours, row["inputs"])
        assert products and not any(fallbacks), model_type  # no int8 weight reached torchao's path
        assert len(quantized) < len(products), model_type  # query, key and value shared their input's quantization
        experts = sum(3 * len(m.experts) for m in ours.modules() if isinstance(m, MixtureOfExperts))
        assert len(products) >= len(quantized_modules(ours)) - experts, model_type  # the rest, and experts chosen
        torch.testing.assert_close(got, reference, atol=0, rtol=0)


def test_one_input_is_quantized_once_for_all_its_projections(monkeypatch):
    """Attention's query, key and value (and a gated feed-forward's gate and up) read one input: with dynamic int8
    weights it is quantized once for all of them, and each output equals torchao's own path bit for bit. A hook on
    any of the layers, or a weight of another kind, and every layer runs on its own (its hooks run)."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    from fivefold.modeling import int8
    from fivefold.modeling.linear import Linear, linears_on_one_input

    torch.manual_seed(0)
    layers = torch.nn.ModuleList([Linear(64, 48), Linear(64, 32, bias=False), Linear(64, 48)])
    quantize_(layers, Int8DynamicActivationInt8WeightConfig())
    x = torch.randn(5, 7, 64) * 3
    quantized, quantize = [], int8._quantize_rows
    monkeypatch.setattr(int8, "_quantize_rows", lambda rows: quantized.append(1) or quantize(rows))

    def check(*layers: torch.nn.Module, times: int) -> None:
        quantized.clear()
        with torch.no_grad():
            got = linears_on_one_input(x, *layers)
            want = [torch.nn.functional.linear(x, layer.weight, layer.bias) for layer in layers]  # torchao's path
        assert len(got) == len(layers) and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        assert len(quantized) == times

    check(*layers, times=1)
    seen = []
    hook = layers[1].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    check(*layers, times=3)
    assert seen == [(5, 7, 32)]
    hook.remove()
    plain = Linear(64, 16)
    quantized.clear()
    with torch.no_grad():
        got = linears_on_one_input(x, layers[0], plain)
        assert torch.equal(got[1], plain(x)) and torch.equal(got[0], layers[0](x))
    assert len(quantized) == 2  # layers[0] on its own in the fallback, then once more in the assertion


def test_dynamic_int8_buffers_are_reused_without_mixing_calls(monkeypatch):
    """The dynamic path's per-thread buffers: every call equals torchao's own path bit for bit whatever ran before it
    (a larger batch, a smaller one, inside and outside inference mode, another thread), an output is never
    overwritten by a later call, and a call larger than `SCRATCH_BYTES` gets buffers of its own."""
    pytest.importorskip("torchao")
    from concurrent.futures import ThreadPoolExecutor

    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    from fivefold.modeling import int8

    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 48))
    quantize_(layer, Int8DynamicActivationInt8WeightConfig())
    weight, bias = layer[0].weight, layer[0].bias
    batches = [torch.randn(rows, 64) * 4 for rows in (40, 3, 17, 40)]

    def both(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return int8.int8_dynamic_linear(x, weight, bias), torch.nn.functional.linear(x, weight, bias)

    with torch.no_grad():
        outputs = []
        for i, x in enumerate(batches):
            with torch.inference_mode(i % 2 == 1):
                got, want = both(x)
            assert torch.equal(got, want)
            outputs.append(got.clone())
        kept = both(batches[0])[0]
        both(batches[1])
        assert torch.equal(kept, outputs[0])  # the later call left the earlier output alone
        with ThreadPoolExecutor(1) as pool:
            assert torch.equal(*pool.submit(both, batches[2]).result())
        monkeypatch.setattr(int8, "SCRATCH_BYTES", 64)
        got, want = both(batches[0])
        assert torch.equal(got, want)


def test_many_rows_take_torchaos_path_exactly(monkeypatch):
    """Past max(INT8PACK_MIN_ROWS, weights / INT8PACK_WEIGHTS_A_ROW) rows of fp32 activations (a long prompt, an
    encoder's batch) a weight-only product is torchao's own, where the kernel would be slower; up to it, and for
    bf16 activations (measured for fp32 only), the kernel's."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from fivefold.modeling import int8

    layer = nn.Linear(32, 48)  # 1,536 weights
    quantize_(layer, Int8WeightOnlyConfig())
    calls = []
    kernel = int8._INT8PACK
    monkeypatch.setattr(int8, "INT8PACK_ON", True)
    monkeypatch.setattr(int8, "_INT8PACK", lambda *args: calls.append(args[0].shape[0]) or kernel(*args))
    for weights_a_row, limit in ((10**6, int8.INT8PACK_MIN_ROWS), (16, 96)):  # (the limit: the minimum, 1536 / 16)
        monkeypatch.setattr(int8, "INT8PACK_WEIGHTS_A_ROW", weights_a_row)
        for rows, dtype, takes in (
            (limit, torch.float32, True),
            (limit + 1, torch.float32, False),
            (limit + 1, torch.bfloat16, True),
        ):
            calls.clear()
            with torch.no_grad():
                got = int8.int8_weight_only_linear(torch.randn(1, rows, 32, dtype=dtype), layer.weight, layer.bias)
            assert calls == ([rows] if takes else [])
            assert (got is not None) == takes


def test_other_torchao_int8_holders_keep_torchaos_path():
    """Only torchao's `Int8Tensor` takes fivefold's int8 linears: `IntxUnpackedToInt8Tensor` holds int8 data, scales
    and a per-row block too, but under `Int8DynamicActivationIntxWeightConfig` it also quantizes the activations,
    which the weight-only kernel would skip."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    from fivefold.modeling import int8

    for config in (
        IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
        Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0)),
    ):
        linear = torch.nn.Sequential(torch.nn.Linear(32, 16))
        quantize_(linear, config)
        weight = linear[0].weight
        assert type(weight).__name__ == "IntxUnpackedToInt8Tensor" and weight.qdata.dtype == torch.int8
        assert int8.int8_weight_parts(weight) is None and int8.int8_dynamic_parts(weight) is None
        assert int8.int8_linear(torch.randn(3, 32), weight, None) is None


def test_quantizing_at_load_with_modules_on_disk_is_a_clear_error(unquantized, tmp_path):
    """torchao quantizing as it loads, with a device map that offloads modules to "disk" (an explicit one, or
    "auto" with too little max_memory): transformers' quantizer would move each such weight to an accelerator and
    fail ("Torch not compiled with CUDA enabled", then a conversion report). fivefold refuses the load first, naming
    a module on disk and what to do instead."""
    pytest.importorskip("torchao")
    row = unquantized(_arch("mixtral"))
    config = QUANTIZERS["torchao-int8-weight"].config("torchao-int8-weight")
    names = [name for name, m in row["ours"].named_modules() if isinstance(m, MixtureOfExperts)]
    disk = f"{names[0]}.experts.1"
    # Disjoint subtrees, as accelerate wants them: the expert on disk, its siblings and every other branch on the CPU.
    device_map = {disk: "disk"}
    for name, _ in row["ours"].named_modules():
        branch = name and not disk.startswith(f"{name}.") and name != disk
        if branch and not any(name.startswith(f"{other}.") for other in device_map):
            device_map[name] = "cpu"
    # "auto" sizes the model as the quantizer will store it: a tenth of its fp32 bytes is too little even in int8.
    tenth = sum(p.numel() * p.element_size() for p in row["ours"].parameters()) // 10
    for kwargs in (dict(device_map=device_map), dict(device_map="auto", max_memory={"cpu": tenth})):
        with pytest.raises(QuantizationError, match=r'quantizes as it loads, and the device map puts .* on "disk"'):
            row["cls"].from_pretrained(row["dst"], quantization_config=config, offload_folder=tmp_path, **kwargs)
    assert not any(tmp_path.iterdir())  # refused before anything was offloaded
    with pytest.raises(QuantizationError, match=rf"puts '{disk}\.\w+' and 2 more modules on \"disk\""):
        row["cls"].from_pretrained(row["dst"], quantization_config=config, device_map=device_map)
    # transformers' torchao loading fails with only the head on disk too (every weight it quantizes).
    head_on_disk = {**{k: v for k, v in device_map.items() if k != disk}, disk: "cpu", "lm_head": "disk"}
    with pytest.raises(QuantizationError, match="puts 'lm_head' on \"disk\""):
        row["cls"].from_pretrained(row["dst"], quantization_config=config, device_map=head_on_disk)


def test_other_quantizers_may_leave_what_they_skip_on_disk():
    """A quantizer other than torchao is refused only for a weight it would quantize on "disk"; a module it leaves
    alone (bitsandbytes' offloaded modules, its skip list) may go there."""
    from types import SimpleNamespace

    from fivefold.modeling.quantization import check_quantizing_to_disk

    model = nn.ModuleDict({"body": nn.Linear(4, 4), "head": nn.Linear(4, 2)})
    quantizer = SimpleNamespace(
        pre_quantized=False,
        quantization_config=SimpleNamespace(quant_method="bitsandbytes"),
        param_needs_quantization=lambda model, name: name.startswith("body."),
    )

    def check(device_map: dict) -> None:
        check_quantizing_to_disk(model, SimpleNamespace(hf_quantizer=quantizer, device_map=device_map))

    check({"body": "cpu", "head": "disk"})
    with pytest.raises(QuantizationError, match="puts 'body' on \"disk\""):
        check({"body": "disk", "head": "cpu"})
    quantizer.pre_quantized = True  # a saved folder: the quantizer's own checks apply
    check({"body": "disk", "head": "cpu"})


def test_quantizing_at_load_reads_one_tensor_at_a_time(unquantized, monkeypatch):
    """A load through a quantizer reads the shards with `pread`, never mapped into the process (whose mapped pages
    would all stay resident until the load ends), hands freed memory back as it reads, and loads the same weights
    as transformers' mapped read."""
    pytest.importorskip("torchao")
    from safetensors import safe_open

    from fivefold.modeling import pretrained, quantized_loading

    row = unquantized(_arch("mixtral"))
    shards = sorted(str(p) for p in Path(row["dst"]).glob("*.safetensors"))
    tensors = 0
    for shard in shards:
        with safe_open(shard, framework="pt") as f:
            tensors += len(list(f.keys()))
    config = QUANTIZERS["torchao-int8-weight"].config("torchao-int8-weight")
    reads, mapped, trims = [], [], []
    read = quantized_loading._TrimmingSlice.__getitem__

    def watched(self, index):
        with open("/proc/self/maps") as maps:
            mapped.append(any(shard in maps.read() for shard in shards))
        reads.append(index)
        return read(self, index)

    monkeypatch.setattr(quantized_loading._TrimmingSlice, "__getitem__", watched)
    monkeypatch.setattr(quantized_loading, "TRIM_EVERY_BYTES", 1)
    monkeypatch.setattr(quantized_loading, "return_freed_memory", lambda: trims.append(1))
    ours = row["cls"].from_pretrained(row["dst"], quantization_config=config).eval()
    assert len(reads) == tensors and not any(mapped)
    assert len(trims) == tensors  # with a 1-byte cadence, once after each read

    monkeypatch.setattr(pretrained, "reads_one_tensor_at_a_time", lambda *args: False)
    mapped_read = row["cls"].from_pretrained(row["dst"], quantization_config=config).eval()
    assert len(reads) == tensors  # the override stood aside
    torch.testing.assert_close(_output(ours, row["inputs"]), _output(mapped_read, row["inputs"]), atol=0, rtol=0)


@pytest.mark.parametrize("model_type", ["gpt2", "mixtral"])  # a head tied to the table, and one of its own
def test_embeddings_quantized_when_the_config_includes_them(unquantized, model_type, tmp_path):
    """torchao's `include_input_output_embeddings=True`: fivefold quantizes the input table and the output head
    (a tied head keeps the table's one quantized weight), where stock quantizes neither table nor tied head; the
    folder saved reloads quantized and tied as it was, with the same outputs."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig

    row = unquantized(_arch(model_type))
    config = transformers.TorchAoConfig(Int8WeightOnlyConfig(), include_input_output_embeddings=True)
    ours = row["cls"].from_pretrained(row["dst"], quantization_config=config).eval()
    table, head = ours.get_input_embeddings(), ours.get_output_embeddings()
    assert is_quantized_weight(table.weight) and is_quantized_weight(head.weight)
    tied = row["ours"].get_input_embeddings().weight is row["ours"].get_output_embeddings().weight
    assert (table.weight is head.weight) == tied
    stock = getattr(transformers, stock_class_name(row["cls"])).from_pretrained(row["src"], quantization_config=config)
    assert not is_quantized_weight(stock.get_input_embeddings().weight)
    assert len(quantized_modules(ours)) == len(expected_quantized(row["ours"], "parameter")) + 2

    diff = (_output(ours, row["inputs"]) - _output(row["ours"], row["inputs"])).abs().max().item()
    assert 0 < diff < 4.0
    prompt = {k: row["inputs"][k] for k in ("input_ids", "attention_mask")}
    out = ours.generate(**prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert out.shape[0] == prompt["input_ids"].shape[0]

    ours.save_pretrained(tmp_path / "q")
    assert ours.get_output_embeddings().weight is head.weight  # the save put the tied copy back
    again = row["cls"].from_pretrained(tmp_path / "q").eval()
    assert quantized_modules(again) == quantized_modules(ours)
    assert (again.get_input_embeddings().weight is again.get_output_embeddings().weight) == tied
    torch.testing.assert_close(_output(again, row["inputs"]), _output(ours, row["inputs"]), atol=0, rtol=0)


def test_int8_table_lookup_equals_torchaos():
    """fivefold's `Embedding` reads an int8 table's rows (int8.py) where torchao dequantizes the whole table: the
    same values, bit for bit, weight-only and dynamic; a plain table takes nn.Embedding's path."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    from fivefold.modeling import int8
    from fivefold.modeling.embeddings import Embedding

    ids = torch.tensor([[0, 5, 99, 5], [3, 1, 2, 0]])
    for kind in (Int8WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig):
        torch.manual_seed(0)
        table = Embedding(100, 32)
        quantize_(table, kind(), filter_fn=lambda *_: True)
        want = nn.Embedding.forward(table, ids)
        got = table(ids)
        assert got.dtype == want.dtype and torch.equal(got, want)
        assert int8.int8_embedding(ids, table.weight) is not None  # the row path ran, not torchao's
        with pytest.raises(IndexError):  # a negative id is out of range, as in F.embedding, not a row from the end
            table(torch.tensor([[-1, 2]]))
    plain = Embedding(100, 32)
    assert torch.equal(plain(ids), nn.Embedding.forward(plain, ids))


def test_embeddings_included_only_where_transformers_would_quantize_them(unquantized):
    """`include_input_output_embeddings=True` takes an `nn.Embedding` table and an `nn.Linear` head only (ViT's input
    is a patch convolution, which stays as it is and runs); a table the config skips stays in full precision with
    the head tied to it; and a quantized table cannot be resized (its full-precision rows are gone)."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig

    row = unquantized(_arch("vit"))
    config = transformers.TorchAoConfig(Int8WeightOnlyConfig(), include_input_output_embeddings=True)
    vit = row["cls"].from_pretrained(row["dst"], quantization_config=config).eval()
    assert not is_quantized_weight(vit.get_input_embeddings().weight)
    assert _output(vit, row["inputs"]).isfinite().all()

    row = unquantized(_arch("gpt2"))
    skipped = transformers.TorchAoConfig(
        Int8WeightOnlyConfig(), include_input_output_embeddings=True, modules_to_not_convert=["word_embeddings"]
    )
    ours = row["cls"].from_pretrained(row["dst"], quantization_config=skipped).eval()
    table, head = ours.get_input_embeddings(), ours.get_output_embeddings()
    assert not is_quantized_weight(table.weight) and head.weight is table.weight

    ours = row["cls"].from_pretrained(row["dst"], quantization_config=config).eval()
    with pytest.raises(NotImplementedError, match="cannot be resized"):
        ours.resize_token_embeddings(ours.config.vocab_size + 8)


def test_int8_weight_checked_once_and_forgotten_with_it(monkeypatch):
    """What int8.py finds of a weight is found once (its checks read every zero point) and dropped with the weight."""
    pytest.importorskip("torchao")
    import gc

    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from fivefold.modeling import int8

    reads = []
    read = int8._read_per_row_int8
    monkeypatch.setattr(int8, "_read_per_row_int8", lambda weight: reads.append(1) or read(weight))
    layer = nn.Linear(32, 16)
    quantize_(layer, Int8WeightOnlyConfig())
    first, again = int8.int8_weight_parts(layer.weight), int8.int8_weight_parts(layer.weight)  # (no kernel asked)
    assert len(reads) == 1 and first is not None and all(a is b for a, b in zip(first, again, strict=True))
    int8.int8_weight_only_linear(torch.randn(2, 32), layer.weight, layer.bias)  # the kernel's operands too
    keys = [("per-row", id(layer.weight)), ("int8pack", id(layer.weight))]
    assert all(key in int8._FOUND for key in keys[: 1 + int8.INT8PACK_ON])
    del layer
    gc.collect()
    assert not any(key in int8._FOUND for key in keys)
