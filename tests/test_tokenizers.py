"""AutoTokenizer on a converted folder builds the tokenizer it builds on the stock folder. Where
`tokenizer_config.json` names no class (bert-base-uncased, gpt2 and roberta-base ship so) AutoTokenizer picks one
by the config's model type, and for some types (Qwen2) it overrides the class the file names: a fivefold type is
read as its stock one."""

import json

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

import fivefold
from fivefold.conversion.samples import build_stock_checkpoint

WORDS = ["the", "cat", "sat", "on", "mat", "paris", "is", "capital", "of", "france"]


def _word_piece() -> transformers.PreTrainedTokenizerFast:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {token: i for i, token in enumerate(specials + WORDS + list("abcdefghijklmnopqrstuvwxyz"))}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]",
                                                sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")  # fmt: skip


def _byte_level() -> transformers.PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    backend.train_from_iterator([" ".join(WORDS)] * 20, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


# (model type, class, tokenizer, what tokenizer_config.json says: None = no file)
CASES = {
    "bert-base-uncased": ("bert", "BertForMaskedLM", _word_piece, {"do_lower_case": True, "model_max_length": 512}),
    "roberta-base": ("roberta", "RobertaForMaskedLM", _word_piece, None),
    "deepseek-r1-distill-qwen": ("qwen2", "Qwen2ForCausalLM", _byte_level, {"tokenizer_class": "LlamaTokenizerFast"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_auto_tokenizer_builds_the_stock_folders_tokenizer(case, tmp_path):
    model_type, stock_class, make, tokenizer_config = CASES[case]
    src = build_stock_checkpoint(model_type, stock_class, tmp_path / "stock")
    make().save_pretrained(src)
    (src / "special_tokens_map.json").unlink(missing_ok=True)
    if tokenizer_config is None:
        (src / "tokenizer_config.json").unlink()
    else:
        (src / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    stock, ours = (transformers.AutoTokenizer.from_pretrained(folder) for folder in (src, dst))
    assert type(ours) is type(stock)
    assert type(stock).__name__ not in ("TokenizersBackend", "PreTrainedTokenizerFast")  # chosen by the model type
    assert ours.special_tokens_map == stock.special_tokens_map
    text = "the cat sat on the mat"
    assert ours(text).input_ids == stock(text).input_ids


def test_fill_mask_runs_on_a_converted_folder_whose_tokenizer_config_names_no_class(tmp_path):
    model_type, stock_class, make, tokenizer_config = CASES["bert-base-uncased"]
    src = build_stock_checkpoint(model_type, stock_class, tmp_path / "stock")
    make().save_pretrained(src)
    (src / "special_tokens_map.json").unlink(missing_ok=True)
    (src / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    fill = transformers.pipeline("fill-mask", model=str(dst), top_k=3)
    assert len(fill("the cat [MASK] on the mat")) == 3
