"""gpt-oss against stock on the same tiny random weights, beyond the table-driven tests: the Hub's MXFP4 layout
(random packed blocks and scales) converted within stock's dequantized logits, other quantizations refused, the
20b checkpoint's MXFP4 files planned at the public size; attention sinks (sdpa equal to eager, gradients
included; kernels that would drop them refused); sliding and full layers at a sequence longer than the window;
the router outputs and auxiliary loss; experts of one layer split across devices; the round trip to stock's
bf16 layout. (Parity of every head, generation: test_parity.py, test_generation.py.)"""

import json
import re
import shutil

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file, save_file

import fivefold
from fivefold import ConversionError, FivefoldGptOssForCausalLM
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.inputs import causal_text_sample
from fivefold.modeling.kernels import attention_kernel

from helpers import plan_on_meta, public_stock_model, shapes_on_disk, stock_parameters

ARCH = architecture_for_model_type("gpt_oss")
TOL = 1e-4
MXFP4_WIDTH = 64  # MXFP4 packs each input row in groups of 32 values: both expert widths a multiple of 32
HUB_QUANTIZATION = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}


def _sample(config) -> tuple[dict, torch.Tensor]:
    inputs = causal_text_sample(config, "GptOssForCausalLM")
    return inputs, inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)


def _to_mxfp4(src, dst, quantization: dict = HUB_QUANTIZATION, seed: int = 0):
    """The stock folder `src` in the Hub's layout: each fused expert weight [E, in, out] replaced by random packed
    FP4 blocks [E, out, in/32, 16] and power-of-two scales [E, out, in/32] (exponents near 2^0)."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    for key in [k for k in tensors if re.search(r"experts\.(gate_up_proj|down_proj)$", k)]:
        experts, inputs, outputs = tensors.pop(key).shape
        groups = (experts, outputs, inputs // 32)
        tensors[f"{key}_blocks"] = torch.randint(0, 256, (*groups, 16), dtype=torch.uint8, generator=gen)
        tensors[f"{key}_scales"] = torch.randint(122, 128, groups, dtype=torch.uint8, generator=gen)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    return dst


@pytest.fixture(scope="module")
def mxfp4(stock_checkpoint, tmp_path_factory):
    src = stock_checkpoint("gpt_oss", "GptOssForCausalLM", intermediate_size=MXFP4_WIDTH)
    return _to_mxfp4(src, tmp_path_factory.mktemp("gpt-oss-mxfp4") / "stock")


def test_mxfp4_folder_converts_within_stock_dequantized_logits(mxfp4, tmp_path):
    stock = transformers.GptOssForCausalLM.from_pretrained(
        mxfp4, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32
    ).eval()
    dst = fivefold.convert(mxfp4, tmp_path / "fivefold", progress=False)
    assert "quantization_config" not in json.loads((dst / "config.json").read_text())
    converted = FivefoldGptOssForCausalLM.from_pretrained(dst).eval()
    direct = FivefoldGptOssForCausalLM.from_pretrained(mxfp4).eval()  # converted in memory

    fused = stock.model.layers[1].mlp.experts  # gate and up interleaved in the columns of gate_up_proj [E, C, 2F]
    expert = converted.model.layers[1].mlp.experts[3]
    assert torch.equal(expert.gate_proj.weight, fused.gate_up_proj[3][:, ::2].t())
    assert torch.equal(expert.up_proj.weight, fused.gate_up_proj[3][:, 1::2].t())
    assert torch.equal(expert.down_proj.weight, fused.down_proj[3].t())
    assert fused.gate_up_proj.abs().max() > 1  # the scales reach past the FP4 values' range: they were applied

    inputs, _ = _sample(stock.config)
    with torch.no_grad():
        expected = stock(**inputs).logits
        for ours in (converted, direct):
            assert (ours(**inputs).logits - expected).abs().max() <= TOL


@pytest.mark.parametrize("method", ["bitsandbytes", "fp8", "gptq"])
def test_other_quantizations_are_refused(stock_checkpoint, tmp_path, method):
    src = stock_checkpoint("gpt_oss", "GptOssForCausalLM", intermediate_size=MXFP4_WIDTH)
    folder = _to_mxfp4(src, tmp_path / "stock", quantization={"quant_method": method})
    with pytest.raises(ConversionError, match=f"quant_method '{method}'.*full precision or quantized with mxfp4"):
        fivefold.convert(folder, tmp_path / "out", progress=False)
    with pytest.raises(ConversionError, match=f"quant_method '{method}'"):
        FivefoldGptOssForCausalLM.from_pretrained(folder)
    assert not (tmp_path / "out").exists()


def test_gpt_oss_20b_mxfp4_files_convert_completely():
    """The Hub's files of openai/gpt-oss-20b: the expert weights as MXFP4 blocks and scales, the rest as stock
    saves it; planned on the meta device, every tensor accounted for, as many parameters as stock's."""
    stock = public_stock_model(ARCH, ARCH.public["openai/gpt-oss-20b"], "GptOssForCausalLM")
    shapes = {}
    for key, shape in shapes_on_disk(stock).items():
        if not re.search(r"experts\.(gate_up_proj|down_proj)$", key):
            shapes[key] = shape
            continue
        experts, inputs, outputs = shape
        shapes[f"{key}_blocks"] = (experts, outputs, inputs // 32, 16)
        shapes[f"{key}_scales"] = (experts, outputs, inputs // 32)
    meta = plan_on_meta(ARCH, stock, shapes)
    assert meta.accounted == set(shapes) and not meta.plan.dropped
    assert meta.produced == meta.expected
    assert meta.expected["model.layers.23.mlp.experts.31.gate_proj.weight"] == (2880, 2880)
    assert meta.expected["model.layers.23.attn.sinks"] == (64,)
    assert meta.parameters == stock_parameters(stock)  # 20.9B


def test_sinks_in_sdpa_equal_eager_with_gradients(converted):
    _, dst = converted("gpt_oss", "GptOssForCausalLM")
    inputs, labels = _sample(FivefoldGptOssForCausalLM.from_pretrained(dst).config)
    assert inputs["input_ids"].shape[1] > ARCH.tiny["sliding_window"]  # the sliding layers really slide
    grads, logits = {}, {}
    for attn in ("eager", "sdpa"):
        model = FivefoldGptOssForCausalLM.from_pretrained(dst, attn_implementation=attn)
        out = model(**inputs, labels=labels)
        out.loss.backward()
        logits[attn] = out.logits.detach()
        grads[attn] = model.model.layers[0].attn.sinks.grad
    assert (logits["eager"] - logits["sdpa"]).abs().max() <= 1e-5
    assert grads["eager"].abs().min() > 0 and torch.allclose(grads["eager"], grads["sdpa"], atol=1e-6)

    with torch.no_grad():  # the sinks change the result: they are not ignored
        model.model.layers[0].attn.sinks.fill_(-1e4)
        assert (model(**inputs).logits - logits["sdpa"]).abs().max() > 1e-3


def test_kernels_that_would_drop_the_sinks_are_refused(converted):
    _, dst = converted("gpt_oss", "GptOssModel")
    model = fivefold.FivefoldGptOssModel.from_pretrained(dst)
    model.config._attn_implementation = "paged|sdpa"  # stock's paged sdpa reads no sinks
    with pytest.raises(ValueError, match="would ignore this model's attention sinks"):
        model(torch.tensor([[5, 6, 7]]))
    assert attention_kernel(model.config, None, sinks=False) is not None  # without sinks any kernel goes


def test_windows_follow_layer_types(converted):
    _, dst = converted("gpt_oss", "GptOssModel")
    model = fivefold.FivefoldGptOssModel.from_pretrained(dst)
    assert model.config.layer_types == ["sliding_attention", "full_attention"]
    assert model.windows == (ARCH.tiny["sliding_window"] - 1, None)
    with pytest.raises(StrictDataclassClassValidationError, match="layer_types must name one of"):
        fivefold.FivefoldGptOssConfig(**ARCH.tiny, layer_types=["sliding_attention", "local"])


def test_router_logits_and_aux_loss_match_stock(converted):
    src, dst = converted("gpt_oss", "GptOssForCausalLM")
    stock = transformers.GptOssForCausalLM.from_pretrained(src).eval()
    ours = FivefoldGptOssForCausalLM.from_pretrained(dst).eval()
    inputs, labels = _sample(stock.config)
    with torch.no_grad():
        a = stock(**inputs, labels=labels, output_router_logits=True)
        b = ours(**inputs, labels=labels, output_router_logits=True)
    assert len(b.router_logits) == stock.config.num_hidden_layers
    for x, y in zip(a.router_logits, b.router_logits, strict=True):  # the router's bias included
        assert x.shape == y.shape == (labels.numel(), stock.config.num_local_experts)
        assert (x - y).abs().max() <= TOL
    assert abs(a.aux_loss - b.aux_loss) <= 1e-5
    assert abs(a.loss - b.loss) <= 1e-5


def test_experts_of_one_layer_on_cpu_and_disk_give_the_same_logits(converted, tmp_path):
    _, dst = converted("gpt_oss", "GptOssForCausalLM")
    plain = FivefoldGptOssForCausalLM.from_pretrained(dst).eval()
    device_map = {"model.embeddings": "cpu", "model.rotary": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    for i in range(plain.config.num_hidden_layers):
        for part in ("norm_before_attn", "attn", "norm_before_mlp", "mlp.router", "mlp.router_logits"):
            device_map[f"model.layers.{i}.{part}"] = "cpu"
        for e in range(plain.config.num_local_experts):
            device_map[f"model.layers.{i}.mlp.experts.{e}"] = "disk" if e % 2 else "cpu"
    placed = FivefoldGptOssForCausalLM.from_pretrained(dst, device_map=device_map, offload_folder=tmp_path).eval()
    assert placed.model.layers[0].mlp.experts[1].up_proj.weight.device.type == "meta"  # on disk until its turn
    inputs, _ = _sample(plain.config)
    with torch.no_grad():
        assert (plain(**inputs).logits - placed(**inputs).logits).abs().max() <= 1e-5


def test_export_writes_stock_bf16_layout(converted, tmp_path):
    src, dst = converted("gpt_oss", "GptOssForCausalLM")
    out = fivefold.export(dst, tmp_path / "stock", progress=False)
    original, exported = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(exported) == set(original)
    assert all(torch.equal(exported[k], original[k]) for k in original)
    assert transformers.AutoConfig.from_pretrained(out).model_type == "gpt_oss"


@pytest.mark.slow
def test_expert_parallel_equals_one_process(converted, tmp_path):
    """Two gloo processes, two of the four experts each (tests/workers/gpt_oss_expert_parallel.py)."""
    from launching import launch

    _, dst = converted("gpt_oss", "GptOssForCausalLM")
    results = launch("gpt_oss_expert_parallel", 2, tmp_path, {"checkpoint": str(dst)}, timeout=300)
    assert [r["held"] for r in results] == [[0, 1], [2, 3]]
    for r in results:
        assert r["logits"] <= 1e-5 and r["generate"], r


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_norms_as_stocks(converted, dtype):
    """gpt-oss's RMSNorm multiplies its weight in fp32 and rounds once (Llama's rounds first), and stock keeps the
    norms' weights in fp32 in an fp16 model: the same parameters stay fp32, and each norm gives stock's bits."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm

    src, dst = converted("gpt_oss", "GptOssForCausalLM")
    stock = transformers.GptOssForCausalLM.from_pretrained(src, dtype=dtype)
    ours = transformers.AutoModelForCausalLM.from_pretrained(dst, dtype=dtype)
    kept = [{n for n, p in m.named_parameters() if p.dtype == torch.float32} for m in (stock, ours)]
    assert len(kept[0]) == len(kept[1]) == (2 * stock.config.num_hidden_layers + 1 if dtype is torch.float16 else 0)
    x = torch.randn(2, 5, stock.config.hidden_size).to(dtype) * 3
    pairs = [
        (stock.model.norm, ours.model.norm),
        (stock.model.layers[0].input_layernorm, ours.model.layers[0].norm_before_attn),
    ]
    for theirs, mine in pairs:
        assert isinstance(theirs, GptOssRMSNorm)
        mine.weight.data.copy_(torch.randn_like(mine.weight.float()) + 1)
        theirs.weight.data.copy_(mine.weight.data)
        assert torch.equal(mine(x), theirs(x))
