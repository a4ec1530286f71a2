"""Masked LM through transformers' collator: BERT's statistics over 200,000 tokens (15% chosen; of those 80% [MASK],
10% random, 10% kept, each within 1%), special tokens and padding never chosen, ModernBERT's 30%, whole words
masked whole, and a fresh mask every epoch (dynamic masking)."""

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, DataCollatorForLanguageModeling

import fivefold
from fivefold import MLM_PROBABILITY, masked_lm_collator

from helpers import minilm_folder

TEXT = (
    "Unbelievably, the tokenization of uncharacteristically long words splits them into several pieces, while "
    "short ones like cat or dog stay whole. Pre-training chooses words, not pieces, when whole-word masking is on."
)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_folder())  # BERT's uncased WordPiece, fast


def ragged_pairs(tokenizer, rows: int, seed: int = 0) -> list[dict]:
    """[CLS] A [SEP] B [SEP] over random ordinary tokens, of lengths 20..500, so the batches carry padding."""
    gen = torch.Generator().manual_seed(seed)
    first = max(tokenizer.all_special_ids) + 1
    examples = []
    for length in torch.randint(20, 500, (rows,), generator=gen).tolist():
        ids = torch.randint(first, tokenizer.vocab_size, (length,), generator=gen).tolist()
        cut = length // 2
        examples.append({"input_ids": [tokenizer.cls_token_id, *ids[:cut], tokenizer.sep_token_id, *ids[cut:]]})
        examples[-1]["input_ids"].append(tokenizer.sep_token_id)
    return examples


def masking_shares(tokenizer, collator, examples: list[dict]) -> dict[str, float]:
    originals, chosen, inputs = [], [], []
    for start in range(0, len(examples), 50):
        part = examples[start : start + 50]
        batch = collator(part)
        padded = tokenizer.pad(part, return_tensors="pt")["input_ids"]
        originals.append(padded.flatten())
        chosen.append((batch["labels"] != -100).flatten())
        inputs.append(batch["input_ids"].flatten())
        real = batch["attention_mask"].bool()
        special = torch.isin(padded, torch.tensor(tokenizer.all_special_ids))
        assert not (chosen[-1].view_as(real) & ~real).any(), "a pad position was chosen"
        assert not (chosen[-1].view_as(real) & special).any(), "a special token was chosen"
        assert torch.equal(batch["input_ids"][~real | special], padded[~real | special])
        picked = chosen[-1].view_as(real)
        assert torch.equal(batch["labels"][picked], padded[picked])  # the label is the original token
    original, chosen, inputs = torch.cat(originals), torch.cat(chosen), torch.cat(inputs)
    ordinary = ~torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    masked = chosen & (inputs == tokenizer.mask_token_id)
    kept = chosen & (inputs == original)
    return {
        "tokens": int(ordinary.sum()),
        "chosen": float(chosen.sum() / ordinary.sum()),
        "mask": float(masked.sum() / chosen.sum()),
        "random": float((chosen & ~masked & ~kept).sum() / chosen.sum()),
        "kept": float(kept.sum() / chosen.sum()),
    }


def test_the_collator_is_transformers_own(tokenizer):
    collator = masked_lm_collator(tokenizer)
    assert type(collator) is DataCollatorForLanguageModeling
    assert (collator.mlm_probability, collator.mask_replace_prob, collator.random_replace_prob) == (0.15, 0.8, 0.1)
    assert fivefold.masked_lm_collator is masked_lm_collator


def test_bert_masking_statistics(tokenizer):
    shares = masking_shares(tokenizer, masked_lm_collator(tokenizer, "bert", seed=0), ragged_pairs(tokenizer, 800))
    assert shares["tokens"] > 10_000
    assert abs(shares["chosen"] - 0.15) < 0.01, shares
    assert abs(shares["mask"] - 0.8) < 0.01, shares
    assert abs(shares["random"] - 0.1) < 0.01, shares
    assert abs(shares["kept"] - 0.1) < 0.01, shares


def test_modernbert_masks_thirty_percent(tokenizer):
    assert MLM_PROBABILITY["modernbert"] == 0.30
    shares = masking_shares(
        tokenizer, masked_lm_collator(tokenizer, "modernbert", seed=1), ragged_pairs(tokenizer, 200)
    )
    assert abs(shares["chosen"] - 0.30) < 0.01, shares
    assert abs(shares["mask"] - 0.8) < 0.02, shares


def test_an_unknown_family_needs_a_rate(tokenizer):
    with pytest.raises(ValueError, match="no masking rate known for 'gpt2'"):
        masked_lm_collator(tokenizer, "gpt2")
    assert masked_lm_collator(tokenizer, "gpt2", mlm_probability=0.2).mlm_probability == 0.2


def test_whole_words_are_masked_whole(tokenizer):
    encodings = [tokenizer(TEXT, return_offsets_mapping=True) for _ in range(400)]
    words = [e.word_ids() for e in encodings]
    collator = masked_lm_collator(tokenizer, whole_word_mask=True, seed=0)
    batch = collator([{k: e[k] for k in ("input_ids", "attention_mask", "offset_mapping")} for e in encodings])
    chosen_words = total_words = 0
    multi_piece_chosen = False
    for row, word_ids in enumerate(words):
        chosen = (batch["labels"][row] != -100).tolist()
        by_word: dict[int, set[bool]] = {}
        for position, word in enumerate(word_ids):
            if word is not None:
                by_word.setdefault(word, set()).add(chosen[position])
        assert all(len(states) == 1 for states in by_word.values()), "a word was masked in part"
        chosen_words += sum(True in states for states in by_word.values())
        total_words += len(by_word)
        multi_piece_chosen |= any(word_ids.count(w) > 1 and True in s for w, s in by_word.items())
        picked = batch["labels"][row] != -100
        assert (batch["input_ids"][row][picked] == tokenizer.mask_token_id).all()  # always [MASK]
    assert multi_piece_chosen  # the text has words of several pieces, and some were chosen
    assert abs(chosen_words / total_words - 0.15) < 0.02


def test_every_epoch_draws_a_fresh_mask(tokenizer):
    examples = ragged_pairs(tokenizer, 16, seed=3)

    def epochs(collator, count: int) -> list[torch.Tensor]:
        loader = DataLoader(examples, batch_size=8, collate_fn=collator)
        return [torch.cat([(batch["labels"] != -100).flatten() for batch in loader]) for _ in range(count)]

    first, second = epochs(masked_lm_collator(tokenizer, seed=0), 2)
    assert first.shape == second.shape and not torch.equal(first, second)
    assert (first != second).float().mean() > 0.1  # not a few flips: a new draw
    assert torch.equal(epochs(masked_lm_collator(tokenizer, seed=0), 1)[0], first)  # and a seed repeats the run
