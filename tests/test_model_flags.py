"""Every capability flag of every fivefold class equals its stock class's, except the deliberate differences listed
below with their reasons. Both models are built from the same tiny config on the meta device."""

import pytest
import torch
import transformers

from fivefold.architectures import ARCHITECTURES, stock_class_name

FLAGS = (
    "_can_compile_fullgraph",
    "supports_pp_plan",
    "_supports_sdpa",
    "_supports_flash_attn",
    "_supports_flex_attn",
    "_supports_attention_backend",
    "supports_gradient_checkpointing",
    "_is_stateful",
    "main_input_name",
)
# (stock class pattern, flag) -> why fivefold may differ there (`*` at either end of a class name: any prefix/suffix).
DIFFERENCES = {
    ("*", "_can_compile_fullgraph"): "fivefold's forward has data-dependent branches (padding checks, packed rows) "
    "that break a full graph; tests/test_compile.py covers torch.compile without fullgraph",
    ("GPT2*", "_supports_flex_attn"): "fivefold's shared attention runs flex attention; stock GPT-2's does not",
    ("Olmoe*", "_supports_flex_attn"): "fivefold's shared attention runs flex attention; stock OLMoE's does not",
    ("OlmoeModel", "supports_pp_plan"): "fivefold's Llama-like configs declare the decoders' pipeline plan; stock "
    "OLMoE's declares none",
    ("T5*", "_supports_flex_attn"): "flex attention builds block masks; T5's relative bias is an additive float mask",
    ("*ForSequenceClassification", "supports_pp_plan"): "pipeline parallelism splits causal LMs only "
    "(modeling/pipeline.py refuses the other classes at load)",
    ("*ForTokenClassification", "supports_pp_plan"): "as for sequence classification",
    ("*ForQuestionAnswering", "supports_pp_plan"): "as for sequence classification",
    ("GPT2Model", "supports_pp_plan"): "the base model declares the plan its causal LM splits by",
    ("GptOss*", "_supports_sdpa"): "fivefold's gpt-oss attention adds its sinks under sdpa too (modeling/gpt_oss.py); "
    "stock's runs them in eager and flash kernels only",
    ("GPT2LMHeadModel", "supports_pp_plan"): "stock GPT-2 has no pipeline plan (its splitter fails on it); "
    "fivefold's equals one process (tests/test_distributed_pipeline_parallel.py)",
}


def _difference(stock_name: str, flag: str) -> str | None:
    for (pattern, listed), reason in DIFFERENCES.items():
        if listed == flag and (
            pattern == "*"
            or pattern == stock_name
            or (pattern.endswith("*") and stock_name.startswith(pattern[:-1]))
            or (pattern.startswith("*") and stock_name.endswith(pattern[1:]))
        ):
            return reason
    return None


def _flags(model) -> dict:
    values = {flag: getattr(model, flag, "<absent>") for flag in FLAGS}  # transformers 5.25 dropped _is_stateful
    values["can_generate"] = model.can_generate()
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    values["tied_output_embeddings"] = output is not None and output.weight is model.get_input_embeddings().weight
    return values


@pytest.mark.parametrize(
    "arch,cls", [(a, c) for a in ARCHITECTURES for c in a.models.values()], ids=lambda c: getattr(c, "__name__", "")
)
def test_flags_equal_stock(arch, cls):
    stock_name = stock_class_name(cls)
    with torch.device("meta"):
        stock = getattr(transformers, stock_name)(transformers.AutoConfig.for_model(arch.stock_model_type, **arch.tiny))
        ours = cls(arch.config_class(**arch.tiny))
    stock.tie_weights(), ours.tie_weights()
    theirs, mine = _flags(stock), _flags(ours)
    differing = {flag for flag, value in theirs.items() if mine[flag] != value}
    unexplained = {flag: (mine[flag], theirs[flag]) for flag in differing if _difference(stock_name, flag) is None}
    assert not unexplained, f"{cls.__name__} differs from stock (ours, stock's): {unexplained}"
