"""The encoders' pre-training objective, masked language modelling, through transformers' own collators.

`masked_lm_collator` returns transformers' `DataCollatorForLanguageModeling` with the settings of the paper each
encoder came from; the masking itself is transformers' and nothing here re-implements it:

    BERT, RoBERTa   15% of the tokens chosen; of those, 80% become [MASK], 10% a random token, 10% stay
    ModernBERT      30% chosen (its paper's rate), the same 80/10/10 split

Special tokens and padding are never chosen. The mask is drawn when a batch is collated, so every epoch sees a new
one: RoBERTa's dynamic masking (BERT's original pipeline masked each example once, when the data was prepared).
`whole_word_mask=True` chooses whole words (every piece of a word, or none) and then always writes [MASK]
(transformers' whole-word masking replaces no token at random); it reads the word boundaries from a fast
tokenizer's `offset_mapping`, so tokenise with `return_offsets_mapping=True`.

`PackedMaskedLMCollator` masks the same way and then packs the batch into one row with transformers'
`DataCollatorWithFlattening` (positions restart per document; docs/packing.md).

Shapes: B batch, T time, N tokens (packed).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DataCollatorForLanguageModeling, DataCollatorWithFlattening

# The share of tokens chosen for prediction, by the family whose pre-training set it.
MLM_PROBABILITY = {"bert": 0.15, "roberta": 0.15, "modernbert": 0.30}


def masked_lm_collator(
    tokenizer,
    family: str = "bert",
    mlm_probability: float | None = None,
    whole_word_mask: bool = False,
    seed: int | None = None,
    pad_to_multiple_of: int | None = None,
) -> DataCollatorForLanguageModeling:
    """transformers' MLM collator at `family`'s masking rate (`MLM_PROBABILITY`), or at `mlm_probability`.

    Examples are dicts from the tokenizer (`input_ids`, and `token_type_ids`, `special_tokens_mask`,
    `offset_mapping` where present) or lists of ids; the batch comes back padded with `labels` holding the chosen
    tokens' ids and -100 elsewhere. Extra keys of the examples (e.g. `next_sentence_label`) pass through."""
    if mlm_probability is None:
        if family not in MLM_PROBABILITY:
            raise ValueError(f"no masking rate known for {family!r}: pass mlm_probability (known: {MLM_PROBABILITY})")
        mlm_probability = MLM_PROBABILITY[family]
    return DataCollatorForLanguageModeling(
        tokenizer,
        mlm=True,
        mlm_probability=mlm_probability,
        whole_word_mask=whole_word_mask,
        # Whole-word masking always writes [MASK]: said here so that transformers does not warn about it.
        mask_replace_prob=1.0 if whole_word_mask else 0.8,
        random_replace_prob=0.0 if whole_word_mask else 0.1,
        seed=seed,
        pad_to_multiple_of=pad_to_multiple_of,
        return_tensors="pt",
    )


def unpadded_rows(batch: dict[str, torch.Tensor]) -> list[dict[str, list[int]]]:
    """A padded MLM batch back into one example per row, its padding dropped."""
    keep = batch["attention_mask"].bool()
    return [
        {"input_ids": batch["input_ids"][i][keep[i]].tolist(), "labels": batch["labels"][i][keep[i]].tolist()}
        for i in range(len(keep))
    ]


@dataclass
class PackedMaskedLMCollator:
    """Masked LM on packed rows: `masked_lm` masks the examples, then transformers' `DataCollatorWithFlattening`
    puts them end to end in one [1, N] row with `position_ids` restarting at `position_ids_start` for every
    document (RoBERTa counts positions from padding_idx + 1 = 2: pass 2). No padding, no attention mask: the
    encoders read the document boundaries from the positions. Token types are not carried (one segment each)."""

    masked_lm: DataCollatorForLanguageModeling
    position_ids_start: int = 0

    def __post_init__(self) -> None:
        self.flatten = DataCollatorWithFlattening(position_ids_start=self.position_ids_start)

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        padded = self.masked_lm([{"input_ids": example["input_ids"]} for example in examples])
        # The first label of each document is the flattening's separator; MLM never chooses it ([CLS]) anyway.
        return self.flatten(unpadded_rows(padded))
