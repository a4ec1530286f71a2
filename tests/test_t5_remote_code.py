"""A converted T5 loads with stock transformers and trust_remote_code=True where fivefold cannot be imported, and
generates the same ids as with fivefold installed."""

import json

import torch
import transformers
from test_remote_code import REMOTE_LOAD, _remote_logits

import fivefold
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.samples import build_stock_checkpoint


def test_converted_t5_forward_and_generate_as_remote_code(tmp_path, monkeypatch):
    src = build_stock_checkpoint("t5", "T5ForConditionalGeneration", tmp_path / "stock", feed_forward_proj="gated-gelu")
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    config = json.loads((dst / "config.json").read_text())
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM", "AutoModelForTextEncoding"}
    shipped = {p.name for p in dst.glob("*.py")}
    assert {"modeling_t5.py", "modeling_encoder_decoder.py", "configuration_t5.py"} <= shipped

    ours = transformers.AutoModelForSeq2SeqLM.from_pretrained(dst).eval()
    inputs = architecture_for_model_type("t5").sample_inputs(ours.config, "T5Model", 0)
    remote = _remote_logits(tmp_path, dst, "AutoModelForSeq2SeqLM", inputs)
    assert remote["cls"] == "FivefoldT5ForConditionalGeneration"
    with torch.no_grad():
        assert (remote["logits"] - ours(**inputs).logits).abs().max() <= 1e-5

    # generate() through the remote class: GenerationMixin and the encoder-decoder cache work without fivefold
    prompt = {k: inputs[k] for k in ("input_ids", "attention_mask")}
    generating = REMOTE_LOAD.replace("out = model(**inputs)", "out = (model.generate(**inputs, max_new_tokens=6),)")
    monkeypatch.setattr("test_remote_code.REMOTE_LOAD", generating)
    remote = _remote_logits(tmp_path, dst, "AutoModelForSeq2SeqLM", prompt)
    assert torch.equal(remote["logits"], ours.generate(**prompt, max_new_tokens=6))
