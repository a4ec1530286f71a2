"""What travels beside the weights reaches the user as it does from a stock folder: the generation defaults (a
folder's generation_config.json, or an older config.json's generation fields), whether fivefold loads the stock
folder directly or its conversion, and the named chat templates of transformers 5's tokenizers."""

import json
import shutil

import pytest
import torch
import transformers

import fivefold
from fivefold.architectures import architecture_for_model_type

GENERATING = [
    ("llama", "LlamaForCausalLM"),
    ("gpt2", "GPT2LMHeadModel"),
    ("mixtral", "MixtralForCausalLM"),
    ("t5", "T5ForConditionalGeneration"),
]
# Stock's T5 generates only with a decoder no deeper than its encoder (a cache sized by the encoder's depth).
DEPTHS = {"t5": dict(num_decoder_layers=2)}
# Settings that each change what greedy generation returns: its length, its search and its end.
SETTINGS = dict(max_new_tokens=6, num_beams=2, repetition_penalty=1.5, no_repeat_ngram_size=2, eos_token_id=[2, 3])
# A checkpoint saved before generation_config.json existed keeps them in config.json (max_length, not new tokens).
LEGACY = dict(max_length=13, num_beams=3, no_repeat_ngram_size=2, repetition_penalty=1.3, min_length=5)


def _generated(model, config) -> torch.Tensor:
    prompt = torch.tensor([[5, 17, 42, 8, 90, 11, 23]])
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), pad_token_id=config.pad_token_id or 0)


def _loads(src, dst, stock_name):
    arch = architecture_for_model_type(transformers.AutoConfig.from_pretrained(src).model_type)
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    direct = arch.class_named(stock_name).from_pretrained(src).eval()  # the stock folder converted in memory
    auto = transformers.AutoModelForSeq2SeqLM if arch.stock_model_type == "t5" else transformers.AutoModelForCausalLM
    return stock, {"the stock folder": direct, "the converted folder": auto.from_pretrained(dst).eval()}


@pytest.mark.parametrize(("model_type", "stock_name"), GENERATING, ids=[m for m, _ in GENERATING])
def test_a_stock_folders_generation_config_is_read_as_by_stock(stock_checkpoint, model_type, stock_name, tmp_path):
    src = tmp_path / "stock"
    shutil.copytree(stock_checkpoint(model_type, stock_name, **DEPTHS.get(model_type, {})), src)
    generation = transformers.GenerationConfig.from_pretrained(src)
    generation.update(**SETTINGS)
    generation.save_pretrained(src)
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    stock, ours = _loads(src, dst, stock_name)
    expected = _generated(stock, stock.config)
    for where, model in ours.items():
        assert model.generation_config.num_beams == 2 and model.generation_config.eos_token_id == [2, 3], where
        assert torch.equal(_generated(model, stock.config), expected), where


@pytest.mark.parametrize(("model_type", "stock_name"), GENERATING, ids=[m for m, _ in GENERATING])
def test_an_older_config_jsons_generation_fields_are_read_as_by_stock(
    stock_checkpoint, model_type, stock_name, tmp_path
):
    src = tmp_path / "stock"
    shutil.copytree(stock_checkpoint(model_type, stock_name, **DEPTHS.get(model_type, {})), src)
    (src / "generation_config.json").unlink()
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **LEGACY}))
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    stock, ours = _loads(src, dst, stock_name)
    expected = _generated(stock, stock.config)
    assert expected.shape[-1] == 13  # the legacy max_length took hold in stock
    for where, model in ours.items():
        assert model.generation_config.max_length == 13 and model.generation_config.num_beams == 3, where
        assert torch.equal(_generated(model, stock.config), expected), where


def test_a_folder_without_generation_fields_gets_no_generation_config(stock_checkpoint, tmp_path):
    src = tmp_path / "stock"
    shutil.copytree(stock_checkpoint("llama", "LlamaForCausalLM"), src)
    (src / "generation_config.json").unlink()
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    assert not (dst / "generation_config.json").exists()  # the defaults from the model's config, as stock's


def test_named_chat_templates_travel_with_the_tokenizer(stock_checkpoint, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    src = tmp_path / "stock"
    shutil.copytree(stock_checkpoint("llama", "LlamaForCausalLM"), src)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "hello": 3, "[UNK]": 4}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>")
    tokenizer.chat_template = {
        "default": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "tool_use": "TOOLS:{{ tools | length }} {% for m in messages %}{{ m['content'] }}{% endfor %}",
    }
    tokenizer.save_pretrained(src)
    assert (src / "additional_chat_templates" / "tool_use.jinja").exists()  # transformers 5's layout
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    messages = [{"role": "user", "content": "hello"}]
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]
    for folder in (src, dst):
        loaded = transformers.AutoTokenizer.from_pretrained(folder)
        text = loaded.apply_chat_template(messages, chat_template="tool_use", tools=tools, tokenize=False)
        assert text == "TOOLS:1 hello", folder


@pytest.mark.parametrize(("model_type", "stock_name"), [("bert", "BertForMaskedLM"), ("mixtral", "MixtralForCausalLM")])
def test_an_unreadable_generation_config_loads_as_stock_loads_it(stock_checkpoint, model_type, stock_name, tmp_path):
    """A model that does not generate reads no generation file (stock's BERT loads a folder whose
    generation_config.json is broken); one that does falls back to config.json, as stock does."""
    src = tmp_path / "stock"
    shutil.copytree(stock_checkpoint(model_type, stock_name), src)
    (src / "generation_config.json").write_text("{oops")
    stock = getattr(transformers, stock_name).from_pretrained(src)
    ours = architecture_for_model_type(model_type).class_named(stock_name).from_pretrained(src)
    if stock.can_generate():  # the defaults from config.json, as stock's
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "max_length", "num_beams", "do_sample"):
            assert getattr(ours.generation_config, name) == getattr(stock.generation_config, name), name


def test_a_model_that_does_not_generate_gets_no_generation_config(stock_checkpoint, tmp_path):
    """An older config.json listing generation fields at their old defaults (max_length 20, ...) gives a BERT no
    generation_config.json: transformers reads none for it."""
    src = tmp_path / "stock"
    shutil.copytree(stock_checkpoint("bert", "BertForMaskedLM"), src)
    (src / "generation_config.json").unlink(missing_ok=True)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "max_length": 20, "num_beams": 1, "do_sample": False}))
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    assert not (dst / "generation_config.json").exists()
