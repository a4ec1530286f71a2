"""Every head of every architecture in the table against its stock class on the same weights, on the architecture's
sample inputs (text: a ragged padded batch; images: a batch at the native size), fp32, logits and all hidden
states within 1e-4; the losses of every sequence or image classifier for each problem type. What only one
architecture has is tested in its own file (test_bert_family.py, test_gpt2.py, ...)."""

import pytest
import torch
import transformers

from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.verify import compare

from helpers import stock_attention

HEADS = [
    pytest.param(arch, stock_class_name(cls), id=cls.__name__) for arch in ARCHITECTURES for cls in arch.models.values()
]
TOL = 1e-4


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize(("arch", "stock_name"), HEADS)
def test_head_matches_stock(converted, arch, stock_name, attn):
    src, dst = converted(arch.stock_model_type, stock_name)
    stock_attn = stock_attention(stock_name, attn)
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=stock_attn).eval()
    ours = arch.class_named(stock_name).from_pretrained(dst, attn_implementation=attn).eval()
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    assert "attention_mask" not in inputs or inputs["attention_mask"].min() == 0  # text: padded and ragged
    diffs = compare(stock, ours, inputs)
    assert any("hidden_states[" in k for k in diffs)
    assert max(diffs.values()) <= TOL, diffs


CLASSIFIERS = [
    pytest.param(arch, stock_class_name(cls), id=cls.__name__)
    for arch in ARCHITECTURES
    for auto_name, cls in arch.models.items()
    if auto_name in ("AutoModelForSequenceClassification", "AutoModelForImageClassification")
]


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "labels"),
    [
        ("single_label_classification", 3, torch.tensor([0, 2, 1])),
        ("regression", 1, torch.tensor([0.5, -1.0, 2.0])),
        ("multi_label_classification", 3, torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 0]])),
        (None, 3, torch.tensor([2, 0, 1])),  # inferred from the labels, as stock does
    ],
)
@pytest.mark.parametrize(("arch", "stock_name"), CLASSIFIERS)
def test_classification_losses_match_stock(converted, arch, stock_name, problem_type, num_labels, labels):
    src, dst = converted(arch.stock_model_type, stock_name, num_labels=num_labels)
    stock = getattr(transformers, stock_name).from_pretrained(src, problem_type=problem_type).eval()
    ours = arch.class_named(stock_name).from_pretrained(dst, problem_type=problem_type).eval()
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    with torch.no_grad():
        a, b = stock(**inputs, labels=labels), ours(**inputs, labels=labels)
    assert type(b).__name__ == type(a).__name__
    assert (a.logits - b.logits).abs().max() <= TOL
    assert abs(a.loss - b.loss) <= TOL
    assert ours.config.problem_type == stock.config.problem_type
