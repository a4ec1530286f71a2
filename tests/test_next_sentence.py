"""Next-sentence pairs as BERT built them (50/50 true next or random, token types, truncation to the maximum length),
and FivefoldBertForPreTraining trained on MLM + NSP through PreTrainingTrainer, both losses logged."""

import random

import pytest
import torch
from transformers import AutoTokenizer, TrainingArguments

from fivefold import (
    FivefoldBertConfig,
    FivefoldBertForPreTraining,
    PreTrainingTrainer,
    masked_lm_collator,
    next_sentence_pairs,
)
from fivefold.next_sentence import truncate_pair

from helpers import minilm_folder

WORDS = "the a cat dog sat ran on under mat barn red big small quickly slowly home away river hill town".split()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_folder())


def documents(count: int, seed: int = 0) -> list[list[str]]:
    """Each document's sentences open with its number ("doc 3 sent 5 ..."), so a pair can be traced to its source."""
    rng = random.Random(seed)
    return [
        [f"doc {d} sent {s} " + " ".join(rng.choices(WORDS, k=rng.randint(4, 14))) for s in range(rng.randint(2, 12))]
        for d in range(count)
    ]


def sources(tokenizer, ids: list[int]) -> list[tuple[int, int]]:
    """(document, sentence) numbers found in a segment's text."""
    words = tokenizer.decode(ids).split()
    return [(int(words[i + 1]), int(words[i + 3])) for i in range(len(words) - 3) if words[i] == "doc"]


def test_pairs_are_half_true_next_with_token_types_and_bounded_length(tokenizer):
    pairs = next_sentence_pairs(documents(300), tokenizer, max_length=64, seed=0)
    assert len(pairs) > 500
    labels = [p["next_sentence_label"] for p in pairs]
    assert abs(sum(labels) / len(labels) - 0.5) < 0.05
    checked = 0
    for pair in pairs:
        ids, types = pair["input_ids"], pair["token_type_ids"]
        assert len(ids) <= 64 and len(ids) == len(types) == len(pair["special_tokens_mask"])
        first_sep = ids.index(tokenizer.sep_token_id)
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
        a, b = sources(tokenizer, ids[1:first_sep]), sources(tokenizer, ids[first_sep + 1 : -1])
        if a and b:  # both segments kept a sentence start through truncation
            checked += 1
            same_document = a[-1][0] == b[0][0]
            if pair["next_sentence_label"] == 0:  # B continues A (truncation may have cut a sentence in between)
                assert same_document and b[0][1] > a[-1][1]
            else:
                assert not same_document
    assert checked > 200


def test_truncation_drops_tokens_from_the_longer_side():
    rng = random.Random(0)
    a, b = list(range(100)), list(range(100, 110))
    truncate_pair(a, b, 40, rng)
    assert len(a) + len(b) == 40 and len(b) == 10  # only A, the longer one, lost tokens
    assert a[0] > 0 and a[-1] < 99  # from both ends
    assert a == list(range(a[0], a[0] + len(a)))  # a contiguous run stays


def test_pairs_need_two_documents(tokenizer):
    with pytest.raises(ValueError, match="at least two non-empty documents"):
        next_sentence_pairs([["only one sentence here"]], tokenizer)


@pytest.mark.slow
def test_pretraining_on_mlm_and_nsp_logs_both_losses(tokenizer, tmp_path):
    torch.manual_seed(0)
    config = FivefoldBertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = FivefoldBertForPreTraining(config)
    pairs = next_sentence_pairs(documents(60), tokenizer, max_length=48, seed=0)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,
        max_steps=8,
        logging_steps=2,
        learning_rate=2e-3,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = PreTrainingTrainer(
        model=model, args=args, train_dataset=pairs, data_collator=masked_lm_collator(tokenizer, seed=0)
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 4
    for entry in logs:
        assert entry["mlm_loss"] > 0 and entry["nsp_loss"] > 0
        # The logged loss is the mean of the summed losses over the same steps.
        assert entry["loss"] == pytest.approx(entry["mlm_loss"] + entry["nsp_loss"], rel=0.02)
    assert logs[-1]["mlm_loss"] < logs[0]["mlm_loss"]
