"""Folders converted before a rename of fivefold's tensor names still load: tests/data holds a tiny T5 (v1.1,
gated) converted by fivefold 0.1, whose stacks named their final norm `final_norm` and their word table
`embed_tokens`. Loading renames them (the model's `_renamed_keys`); export reads them under today's names."""

from pathlib import Path

import torch
import transformers
from safetensors import safe_open

import fivefold
from fivefold.conversion.inputs import text_inputs

OLD = Path(__file__).parent / "data" / "t5-tiny-fivefold-0.1"


def test_a_folder_in_the_previous_layout_loads_every_tensor():
    model, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(OLD, output_loading_info=True)
    assert type(model) is fivefold.FivefoldT5ForConditionalGeneration
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched
    state = model.state_dict()
    with safe_open(OLD / "model.safetensors", "pt") as stored:
        assert {"encoder.final_norm.weight", "decoder.final_norm.weight"} <= set(stored.keys())
        for key in stored.keys():
            renamed = key.replace("final_norm", "norm")
            assert torch.equal(state[renamed], stored.get_tensor(key)), key


def test_export_and_reconversion_of_the_previous_layout(tmp_path):
    ours = transformers.AutoModelForSeq2SeqLM.from_pretrained(OLD).eval()
    fivefold.export(OLD, tmp_path / "stock", progress=False)
    stock = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "stock").eval()
    again = fivefold.convert(tmp_path / "stock", tmp_path / "again", progress=False)
    with safe_open(again / "model.safetensors", "pt") as stored:
        assert "encoder.norm.weight" in stored.keys() and not any("final_norm" in k for k in stored.keys())
    inputs = text_inputs(stock.config)
    inputs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    labels = torch.randint(2, stock.config.vocab_size, (3, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = stock(**inputs, labels=labels).logits
        assert (ours(**inputs, labels=labels).logits - expected).abs().max() <= 1e-4
        reloaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(again).eval()
        assert (reloaded(**inputs, labels=labels).logits - expected).abs().max() <= 1e-4
