"""torch.export and torch.onnx.export(dynamo=True) for every encoder, ViT, GPT-2 and two mixtures (stock's mixtures fail
ONNX's conversion), and torch.jit.trace for every architecture's forward: what each gives equals eager (fp32, within
1e-4; the ONNX model run in onnxruntime), on the ragged sample batch eager unpads. A decoder's batch is
left-padded: a padding query sees no key, and what it returns is undefined (stock's too), so only real tokens are
compared there."""

import numpy as np
import pytest
import torch
import transformers

from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.modeling.decoder import DecoderModel

from helpers import stock_attention

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TOL = 1e-4
EXPORTED = [
    pytest.param(arch, id=arch.stock_model_type)
    for arch in ARCHITECTURES
    if arch.stock_model_type in ("bert", "roberta", "modernbert", "vit", "gpt2", "mixtral", "gpt_oss")
]


def load(converted, arch):
    name = stock_class_name(arch.base_model)
    _, dst = converted(arch.stock_model_type, name)
    model = arch.base_model.from_pretrained(dst, attn_implementation="sdpa").eval()
    inputs = arch.sample_inputs(model.config, name, 0)
    options = {"use_cache": False} if isinstance(model, DecoderModel) else {}
    return model, inputs, options


@pytest.mark.slow  # torch.onnx's dynamo export
@pytest.mark.parametrize("arch", EXPORTED)
def test_onnx_export_runs_in_onnxruntime_as_eager(converted, arch, tmp_path):
    model, inputs, options = load(converted, arch)
    with torch.no_grad():
        expected = model(**inputs, **options).last_hidden_state
    program = torch.onnx.export(model, (), kwargs={**inputs, **options}, dynamo=True, optimize=False, verbose=False)
    program.save(str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
    got = session.run(None, feed)[0]
    assert got.shape == tuple(expected.shape)
    assert np.abs(got - expected.numpy())[real_tokens(model, inputs, expected.shape).numpy()].max() <= TOL


def real_tokens(model, inputs: dict, shape: torch.Size) -> torch.Tensor:
    """[B, T] bool: the positions compared with eager (a decoder's padding queries see no key)."""
    if isinstance(model, DecoderModel):
        return inputs["attention_mask"].bool()
    return torch.ones(shape[:2], dtype=torch.bool)


@pytest.mark.parametrize("arch", [pytest.param(arch, id=arch.stock_model_type) for arch in ARCHITECTURES])
def test_jit_trace_equals_eager(converted, arch):
    """torch.jit.trace, which TorchScript deployments (IPEX, AWS Neuron) start from, as stock's models take it: while
    it traces, shapes are tensors and vmap cannot run (ModernBERT's window masks and gpt-oss's sinks failed here)."""
    model, inputs, _ = load(converted, arch)
    model.config.use_cache = False  # a trace returns tensors, and a cache is none
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
        got = traced(**inputs)["last_hidden_state"]
    assert got.shape == expected.shape
    assert (got - expected).abs()[real_tokens(model, inputs, got.shape)].max() <= TOL


@pytest.mark.parametrize("model_type", ["bert", "mixtral", "gpt_oss"])
def test_exported_program_takes_other_lengths(converted, model_type):
    """One torch.export program with a dynamic batch and length, run on a batch of another shape. (gpt-oss's sinks,
    a mask that needs gradients, sent sdpa where non-strict export could not prove its shapes: exporters get eager's
    attention there.)"""
    (arch,) = [a for a in ARCHITECTURES if a.stock_model_type == model_type]
    model, inputs, _ = load(converted, arch)
    model.config.use_cache = False
    batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=64)
    shapes = {k: {0: batch, 1: length} for k in inputs}
    program = torch.export.export(model, (), kwargs=inputs, dynamic_shapes=shapes)  # non-strict, torch's default
    other = {k: v[:2, -9:].contiguous() for k, v in inputs.items()}  # the last tokens: a real one in every row
    with torch.no_grad():
        expected = model(**other).last_hidden_state
    got = program.module()(**other).last_hidden_state
    assert (got - expected).abs()[real_tokens(model, other, got.shape)].max() <= TOL


@pytest.mark.parametrize("model_type", ["llama", "mixtral", "gpt_oss"])
def test_executorch_export_of_a_decoder_steps_as_stock(converted, model_type):
    """transformers' ExecuTorch wrapper (a StaticCache, one token a step, `torch.export` with strict tracing) exports
    the causal LM, and each step's logits equal stock's exported program's on the same weights. (fivefold's default
    positions, `arange(past, past + T)`, had a size the tracer could not bound when `past` comes from the cache.)"""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    (arch,) = [a for a in ARCHITECTURES if a.stock_model_type == model_type]
    ours_class = arch.models["AutoModelForCausalLM"]
    stock_name = stock_class_name(ours_class)
    src, dst = converted(model_type, stock_name)
    attn = stock_attention(stock_name, "sdpa")
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=attn).eval()
    programs = []
    for model in (stock, ours_class.from_pretrained(dst).eval()):
        model.generation_config.cache_implementation = "static"
        model.generation_config.cache_config = {"batch_size": 1, "max_cache_len": 16}
        wrapper = TorchExportableModuleForDecoderOnlyLM(model)
        programs.append(wrapper.export(input_ids=torch.tensor([[1]]), cache_position=torch.tensor([0])).module())
    tokens = torch.randint(3, stock.config.vocab_size, (6,), generator=torch.Generator().manual_seed(0))
    for step, token in enumerate(tokens.tolist()):
        inputs = {"input_ids": torch.tensor([[token]]), "cache_position": torch.tensor([step])}
        expected, got = (program(**inputs) for program in programs)
        assert (got - expected).abs().max() <= TOL
