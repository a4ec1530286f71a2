"""Every head of every encoder against its stock class on the same weights, on the architecture's sample inputs
(text: a ragged padded batch with token types; images: a batch at the native size), fp32, logits and all hidden
states within 1e-4."""

import pytest
import torch
import transformers

from fivefold.architectures import ARCHITECTURES, stock_class_name
from fivefold.conversion.inputs import text_inputs
from fivefold.conversion.verify import compare

HEADS = [(arch.stock_model_type, stock_class_name(cls)) for arch in ARCHITECTURES for cls in arch.models.values()]
TOL = 1e-4


def _pair(converted, model_type, stock_name, attn, **ours_kwargs):
    src, dst = converted(model_type, stock_name)
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=attn).eval()
    arch = next(a for a in ARCHITECTURES if a.stock_model_type == model_type)
    ours = arch.class_named(stock_name).from_pretrained(dst, attn_implementation=attn, **ours_kwargs).eval()
    return stock, ours


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize(("model_type", "stock_name"), HEADS)
def test_head_matches_stock(converted, model_type, stock_name, attn):
    stock, ours = _pair(converted, model_type, stock_name, attn)
    arch = next(a for a in ARCHITECTURES if a.stock_model_type == model_type)
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    assert "attention_mask" not in inputs or inputs["attention_mask"].min() == 0  # text: padded and ragged
    diffs = compare(stock, ours, inputs)
    assert any("hidden_states[" in k for k in diffs)
    assert max(diffs.values()) <= TOL, diffs


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_output_fields_and_attentions_match_stock(converted, model_type):
    stock_name = "BertModel" if model_type == "bert" else "RobertaModel"
    stock, ours = _pair(converted, model_type, stock_name, "eager")
    inputs = text_inputs(stock.config)
    with torch.no_grad():
        expected = stock(**inputs, output_attentions=True, output_hidden_states=True)
        got = ours(**inputs, output_attentions=True, output_hidden_states=True)
    # Stock also returns an empty `cross_attentions` (its decoder mode); encoders have none.
    assert {k for k, v in expected.items() if len(v)} == set(got.keys())
    assert len(got.attentions) == stock.config.num_hidden_layers
    for a, b in zip(expected.attentions, got.attentions, strict=True):
        assert (a - b).abs().max() <= TOL
    tuple_out = ours(**inputs, return_dict=False)
    assert torch.allclose(tuple_out[0], got.last_hidden_state)


def test_roberta_positions_start_after_padding(converted):
    """Left padding moves RoBERTa's positions; ours must follow stock, not BERT's arange."""
    stock, ours = _pair(converted, "roberta", "RobertaModel", "sdpa")
    inputs = text_inputs(stock.config)
    ids, mask = inputs["input_ids"].flip(1), inputs["attention_mask"].flip(1)  # left padded
    with torch.no_grad():
        a = stock(input_ids=ids, attention_mask=mask).last_hidden_state
        b = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (a - b)[mask.bool()].abs().max() <= TOL


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_inputs_embeds_path_matches_stock(converted, model_type):
    stock_name = "BertModel" if model_type == "bert" else "RobertaModel"
    stock, ours = _pair(converted, model_type, stock_name, "sdpa")
    inputs = text_inputs(stock.config)
    embeds = stock.get_input_embeddings()(inputs["input_ids"])
    with torch.no_grad():
        a = stock(inputs_embeds=embeds, attention_mask=inputs["attention_mask"]).last_hidden_state
        b = ours(inputs_embeds=embeds, attention_mask=inputs["attention_mask"]).last_hidden_state
    assert (a - b)[inputs["attention_mask"].bool()].abs().max() <= TOL


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "labels"),
    [
        ("single_label_classification", 3, torch.tensor([0, 2, 1])),
        ("regression", 1, torch.tensor([0.5, -1.0, 2.0])),
        ("multi_label_classification", 3, torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 0]])),
    ],
)
def test_sequence_classification_losses_match_stock(converted, problem_type, num_labels, labels):
    src, dst = converted("bert", "BertForSequenceClassification", num_labels=num_labels)
    stock = transformers.BertForSequenceClassification.from_pretrained(src, problem_type=problem_type).eval()
    ours = transformers.AutoModelForSequenceClassification.from_pretrained(dst, problem_type=problem_type).eval()
    inputs = text_inputs(stock.config)
    with torch.no_grad():
        a, b = stock(**inputs, labels=labels), ours(**inputs, labels=labels)
    assert abs(a.loss - b.loss) <= TOL


def test_task_losses_match_stock(converted):
    """MLM, token classification, QA, multiple choice, NSP and pre-training losses equal stock's. Padded mode: the
    token labels and the span softmax here also cover padded positions, which unpadded execution leaves at zero."""
    cases = {
        "BertForMaskedLM": lambda x: {"labels": x["input_ids"].masked_fill(x["attention_mask"] == 0, -100)},
        "BertForTokenClassification": lambda x: {"labels": x["input_ids"] % 2},
        "BertForQuestionAnswering": lambda x: {
            "start_positions": torch.tensor([1, 2, 40]),
            "end_positions": torch.tensor([3, 2, 5]),
        },
        "BertForNextSentencePrediction": lambda x: {"labels": torch.tensor([0, 1, 1])},
        "BertForPreTraining": lambda x: {
            "labels": x["input_ids"].masked_fill(x["attention_mask"] == 0, -100),
            "next_sentence_label": torch.tensor([0, 1, 0]),
        },
    }
    for stock_name, labels in cases.items():
        stock, ours = _pair(converted, "bert", stock_name, "sdpa", unpad_inputs=False)
        inputs = text_inputs(stock.config)
        with torch.no_grad():
            a, b = stock(**inputs, **labels(inputs)), ours(**inputs, **labels(inputs))
        assert abs(a.loss - b.loss) <= TOL, stock_name
    stock, ours = _pair(converted, "bert", "BertForMultipleChoice", "sdpa")
    inputs = text_inputs(stock.config, choices=2)
    with torch.no_grad():
        a, b = stock(**inputs, labels=torch.tensor([1, 0, 1])), ours(**inputs, labels=torch.tensor([1, 0, 1]))
    assert abs(a.loss - b.loss) <= TOL


@pytest.mark.parametrize(
    ("model_type", "stock_name"),
    [
        ("bert", "BertForSequenceClassification"),
        ("bert", "BertForMultipleChoice"),
        ("bert", "BertForPreTraining"),
        ("roberta", "RobertaForSequenceClassification"),
        ("roberta", "RobertaForMultipleChoice"),
        ("roberta", "RobertaForTokenClassification"),
    ],
)
def test_training_mode_dropout_matches_stock(converted, model_type, stock_name):
    """Same seed, same dropout masks: outputs in train mode equal stock's only if every dropout sits where stock
    puts it, with the same probability (classifier_dropout differs from hidden_dropout_prob here)."""
    src, dst = converted(model_type, stock_name)
    arch = next(a for a in ARCHITECTURES if a.stock_model_type == model_type)
    kwargs = dict(classifier_dropout=0.5, attn_implementation="eager")
    stock = getattr(transformers, stock_name).from_pretrained(src, **kwargs).train()
    ours = arch.class_named(stock_name).from_pretrained(dst, **kwargs).train()
    inputs = text_inputs(stock.config, choices=2 if stock_name.endswith("ForMultipleChoice") else None)
    torch.manual_seed(123)
    expected = stock(**inputs)[0]
    torch.manual_seed(123)
    got = ours(**inputs)[0]
    assert (expected - got).abs().max() <= TOL
