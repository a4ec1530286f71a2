"""BERT and RoBERTa, which share the encoder layout, against stock on the same weights: output fields and
attention weights, RoBERTa's positions after left padding, inputs_embeds, the task losses, dropout placement in
training; the files of the original uploads (legacy names, no prefix, stored buffers; also at the public size on
the meta device), an untied decoder and an untied MLM bias."""

import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

import fivefold
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.inputs import text_inputs
from fivefold.conversion.keymap import legacy_norm_names
from fivefold.conversion.verify import compare, verify

from helpers import plan_on_meta, public_stock_model, read_tensors, shapes_on_disk, stock_parameters

TOL = 1e-4


def _pair(converted, model_type, stock_name, attn, **ours_kwargs):
    src, dst = converted(model_type, stock_name)
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=attn).eval()
    arch = architecture_for_model_type(model_type)
    ours = arch.class_named(stock_name).from_pretrained(dst, attn_implementation=attn, **ours_kwargs).eval()
    return stock, ours


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_output_fields_and_attentions_match_stock(converted, model_type):
    stock_name = "BertModel" if model_type == "bert" else "RobertaModel"
    stock, ours = _pair(converted, model_type, stock_name, "eager")
    inputs = text_inputs(stock.config)
    with torch.no_grad():
        expected = stock(**inputs, output_attentions=True, output_hidden_states=True)
        got = ours(**inputs, output_attentions=True, output_hidden_states=True)
    # Both return an empty `cross_attentions` too (stock's decoder mode): an encoder has no cross-attention layer.
    assert set(expected.keys()) == set(got.keys()) and got.cross_attentions == ()
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
    arch = architecture_for_model_type(model_type)
    kwargs = dict(classifier_dropout=0.5, attn_implementation="eager")
    stock = getattr(transformers, stock_name).from_pretrained(src, **kwargs).train()
    ours = arch.class_named(stock_name).from_pretrained(dst, **kwargs).train()
    inputs = text_inputs(stock.config, choices=2 if stock_name.endswith("ForMultipleChoice") else None)
    torch.manual_seed(123)
    expected = stock(**inputs)[0]
    torch.manual_seed(123)
    got = ours(**inputs)[0]
    assert (expected - got).abs().max() <= TOL


# --- the files of the original uploads -----------------------------------------------------------------------


def _to_legacy(key: str) -> str:
    # bert-base-uncased's files use TF-era names: LayerNorm.gamma / LayerNorm.beta
    return key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")


@pytest.mark.parametrize(
    ("model_type", "hub_id", "stock_class", "legacy"),
    [
        ("bert", "google-bert/bert-base-uncased", "BertForPreTraining", True),
        ("bert", "google-bert/bert-base-uncased", "BertModel", False),
        ("roberta", "FacebookAI/roberta-base", "RobertaForMaskedLM", False),
        ("roberta", "FacebookAI/roberta-base", "RobertaModel", False),
    ],
)
def test_public_size_old_files_convert_completely(model_type, hub_id, stock_class, legacy):
    """At the public size on the meta device: the position_ids buffer old files store, and bert-base-uncased's
    LayerNorm.gamma / beta."""
    arch = architecture_for_model_type(model_type)
    fields = arch.public[hub_id]
    stock = public_stock_model(arch, fields, stock_class)
    shapes = shapes_on_disk(stock)
    prefix = "" if stock_class.endswith("Model") else f"{stock.base_model_prefix}."
    shapes[f"{prefix}embeddings.position_ids"] = (1, fields["max_position_embeddings"])  # stored by old files
    if legacy:
        shapes = {_to_legacy(k): v for k, v in shapes.items()}
        assert any(k.endswith("gamma") for k in shapes)
    meta = plan_on_meta(arch, stock, shapes)

    assert meta.accounted == set(shapes)
    assert meta.plan.dropped == [f"{prefix}embeddings.position_ids"]
    assert set(meta.expected) - set(meta.tied) <= set(meta.produced)
    extras = set(meta.produced) - set(meta.expected)  # kept for the round trip: only other heads' tensors
    assert all(k.startswith(("model.pooler.", "nsp_head.", "lm_head.", "pooler.")) for k in extras), extras
    for key in meta.expected:
        if key in meta.produced:
            assert meta.produced[key] == meta.expected[key], key
    assert meta.parameters == stock_parameters(stock)  # really the public size
    assert legacy_norm_names("x.LayerNorm.gamma") == "x.LayerNorm.weight"


def test_legacy_bin_without_prefix_and_gamma_beta(converted, tmp_path):
    """An old-style pytorch_model.bin: no `bert.` prefix on encoder tensors, LayerNorm.gamma/beta, position_ids."""
    src, _ = converted("bert", "BertForMaskedLM")
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    state = {}
    for key, value in read_tensors(src).items():
        key = key.removeprefix("bert.").replace("LayerNorm.weight", "LayerNorm.gamma")
        state[key.replace("LayerNorm.bias", "LayerNorm.beta")] = value
    state["embeddings.position_ids"] = torch.arange(64)[None]
    torch.save(state, legacy / "pytorch_model.bin")
    (legacy / "config.json").write_text((src / "config.json").read_text())
    dst = fivefold.convert(legacy, tmp_path / "converted", progress=False)
    assert max(verify(src, dst).values()) <= 1e-4


def test_untied_decoder_is_kept(converted, tmp_path):
    """A checkpoint whose stored decoder differs from the embeddings loads untied, as in stock."""
    src, _ = converted("bert", "BertForMaskedLM")
    untied = tmp_path / "untied"
    untied.mkdir()
    tensors = read_tensors(src)
    tensors["cls.predictions.decoder.weight"] = torch.randn_like(tensors["bert.embeddings.word_embeddings.weight"])
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"].clone()  # untied saves store both
    save_file(tensors, untied / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    dst = fivefold.convert(untied, tmp_path / "converted", progress=False)
    assert json.loads((dst / "config.json").read_text())["tie_word_embeddings"] is False
    assert max(verify(untied, dst).values()) <= 1e-4


@pytest.mark.parametrize(
    ("model_type", "stock_name", "unused_bias"),
    [("bert", "BertForMaskedLM", "cls.predictions.bias"), ("roberta", "RobertaForMaskedLM", "lm_head.bias")],
)
def test_untied_mlm_head_reads_the_decoders_bias_as_stock(converted, tmp_path, model_type, stock_name, unused_bias):
    """transformers 5.x saves an untied MLM head's bias twice, apart: its model reads the decoder's, and so does
    fivefold's, converted or loaded from the stock folder; exported, the bias is back under the decoder's name."""
    src, dst = converted(model_type, stock_name, tie_word_embeddings=False)
    tensors = read_tensors(src)
    decoder_bias = unused_bias.replace("bias", "decoder.bias")
    assert not torch.equal(tensors[unused_bias], tensors[decoder_bias])
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    arch = architecture_for_model_type(model_type)
    for folder in (dst, src):
        ours = arch.class_named(stock_name).from_pretrained(folder).eval()
        assert max(compare(stock, ours, arch.sample_inputs(stock.config, stock_name, 0)).values()) <= TOL
    back = fivefold.export(dst, tmp_path / "exported", progress=False)  # the bias under the name stock reads
    assert decoder_bias in read_tensors(back)
    assert max(verify(src, dst).values()) <= TOL
    exported = getattr(transformers, stock_name).from_pretrained(back).eval()
    assert max(compare(stock, exported, arch.sample_inputs(stock.config, stock_name, 0)).values()) <= TOL
