"""Optional parts: the tensors a stock class initialises fresh when a checkpoint lacks them (poolers, heads, untied
decoders) convert as stock loads them: a warning, nothing written for them, fresh initialisation on loading as
stock's; `verify` compares what the checkpoint holds; fivefold's from_pretrained of the stock folder loads it too.
The backbone's tensors are never optional."""

import json
import re
import shutil
import warnings

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import fivefold
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.errors import CheckpointWarning, ConversionError
from fivefold.conversion.verify import stock_values_of

# (model type, class the weights were saved from, class config.json names, stock tensors removed, config overrides)
ROWS = [
    ("bert", "BertModel", "BertModel", r"pooler\.", {}),  # an embedding checkpoint saved without its pooler
    ("bert", "BertForMaskedLM", "BertModel", r"^cls\.|pooler\.", {}),  # saved from a head without one
    ("bert", "BertModel", "BertForMaskedLM", r"pooler\.", {}),  # the MLM head of a base checkpoint
    ("bert", "BertForPreTraining", "BertForPreTraining", r"seq_relationship|pooler\.", {}),  # no NSP head
    ("roberta", "RobertaModel", "RobertaForSequenceClassification", r"pooler\.", {}),  # a classifier to train
    ("vit", "ViTModel", "ViTModel", r"pooler\.", {}),
    ("modernbert", "ModernBertModel", "ModernBertForMaskedLM", r"^$", {}),  # a fresh head, its stds scaled as stock
    ("modernbert", "ModernBertModel", "ModernBertForSequenceClassification", r"^$", {}),  # the classifier: by width
    ("gpt2", "GPT2LMHeadModel", "GPT2LMHeadModel", r"^lm_head\.", {"tie_word_embeddings": False}),  # untied
    ("mixtral", "MixtralForCausalLM", "MixtralForCausalLM", r"^lm_head\.", {}),  # an untied decoder
]


def strip(src, dst, pattern: str, names: str, config_fields: dict | None = None):
    """A copy of `src` without the tensors `pattern` matches, its config naming `names` (and `config_fields`)."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    kept = {k: v for k, v in tensors.items() if not (pattern != "^$" and re.search(pattern, k))}
    save_file(kept, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **(config_fields or {}), "architectures": [names]}))
    return dst


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r[1]}-as-{r[2]}-without-{r[3]}")
def test_missing_optional_parts_convert_and_load_as_stock(stock_checkpoint, tmp_path, row):
    model_type, saved_from, named, pattern, overrides = row
    # The overrides also go into config.json: T5's stock config does not keep an untied head through its init.
    src = strip(stock_checkpoint(model_type, saved_from, **overrides), tmp_path / "src", pattern, named, overrides)
    with pytest.warns(CheckpointWarning, match="not in the checkpoint and not written: loading initialises them"):
        dst = fivefold.convert(src, tmp_path / "dst", progress=False)

    arch = architecture_for_model_type(model_type)
    diffs = fivefold.verify(src, dst)
    assert max(diffs.values()) <= 1e-4, diffs

    # Fresh tensors as stock initialises them: the same constants (zero biases, unit norms), the same spread.
    torch.manual_seed(0)
    stock = getattr(transformers, named).from_pretrained(src)
    ours, info = arch.class_named(named).from_pretrained(dst, output_loading_info=True)
    fresh = set(info["missing_keys"])
    assert fresh
    theirs = stock_values_of(arch, stock, type(ours), ours.config, fresh)
    state = ours.state_dict()
    for key in fresh:
        a, b = state[key].float(), theirs[key].float()
        if b.numel() > 1 and b.std() > 0:
            assert 0.8 < float(a.std() / b.std()) < 1.25, key  # a std off by sqrt(2 * layers) fails
        else:
            assert torch.equal(a, b), key

    direct = arch.class_named(named).from_pretrained(src)  # the stock folder, converted in memory
    assert set(direct.state_dict()) == set(state)


def test_backbone_tensors_are_not_optional(stock_checkpoint, tmp_path):
    src = strip(stock_checkpoint("bert", "BertModel"), tmp_path / "src", r"layer\.1\.output\.dense", "BertModel")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        with pytest.raises(ConversionError, match=r"2 tensor\(s\) missing from the checkpoint"):
            fivefold.convert(src, tmp_path / "dst", progress=False)


def test_t5_without_its_untied_head_is_tied_as_stock_ties_it(stock_checkpoint, tmp_path):
    """T5 v1.1 files hold an `lm_head` of their own; one without it is not a fresh head in stock (its config ties
    the head whenever the file lacks one): no warning, the head is `shared`, on both sides."""
    src = strip(
        stock_checkpoint("t5", "T5ForConditionalGeneration"),
        tmp_path / "src",
        r"^lm_head\.",
        "T5ForConditionalGeneration",
    )
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        dst = fivefold.convert(src, tmp_path / "dst", progress=False)
    stock = transformers.T5ForConditionalGeneration.from_pretrained(src)
    ours = fivefold.FivefoldT5ForConditionalGeneration.from_pretrained(dst)
    assert torch.equal(stock.lm_head.weight, stock.shared.weight)
    assert torch.equal(ours.lm_head.weight, ours.shared.weight) and torch.equal(ours.shared.weight, stock.shared.weight)
