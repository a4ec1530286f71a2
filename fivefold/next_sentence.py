"""BERT's second pre-training objective: next-sentence prediction (NSP) pairs built from documents.

`next_sentence_pairs` follows BERT's `create_pretraining_data.py`: segments (sentences) of a document are gathered
up to a target length (the maximum, or with probability `short_seq_prob` a shorter random one), split at a random
point into A and B; half of the time B is replaced by a run of segments from another document (the segments not
used go back for the next pair). The pair is truncated to the maximum length by dropping tokens from the longer
side, at its front or back at random, and written as

    [CLS] A [SEP] B [SEP]        token_type_ids  0 ... 0  1 ... 1      next_sentence_label  0 = B follows A, 1 = random

One difference from BERT: a chunk of a single segment (a long sentence, or a document's last one) is split inside
the segment when its B is the true next one, so that the labels split 50/50; BERT's pipeline made every such chunk
a random pair, about 60% random pairs over short documents.
"""

import random
from collections.abc import Sequence


def truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Shorten A and B in place to `max_tokens` together: from the longer one, at its front or back at random."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        del longer[0 if rng.random() < 0.5 else -1]


def random_run(documents: list[list[list[int]]], avoid: int, target: int, rng: random.Random) -> list[int]:
    """Segments of a random other document from a random start, until `target` tokens (BERT's random next)."""
    others = [d for d in range(len(documents)) if d != avoid and documents[d]]
    if not others:
        raise ValueError("next-sentence pairs need at least two non-empty documents (random pairs come from another)")
    document = documents[rng.choice(others)]
    tokens: list[int] = []
    for segment in document[rng.randrange(len(document)) :]:
        tokens.extend(segment)
        if len(tokens) >= target:
            break
    return tokens


def pair_example(a: list[int], b: list[int], is_random: bool, cls: int, sep: int) -> dict:
    return {
        "input_ids": [cls, *a, sep, *b, sep],
        "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
        "special_tokens_mask": [1, *[0] * len(a), 1, *[0] * len(b), 1],
        "next_sentence_label": int(is_random),
    }


def document_pairs(
    documents: list[list[list[int]]], index: int, max_length: int, short_seq_prob: float, rng: random.Random, ids
) -> list[dict]:
    """The pairs of one document (BERT's `create_instances_from_document`)."""
    document, max_tokens = documents[index], max_length - 3  # [CLS], [SEP], [SEP]
    target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
    pairs, chunk, i = [], [], 0
    while i < len(document):
        chunk.append(document[i])
        if i == len(document) - 1 or sum(map(len, chunk)) >= target:
            whole_segments = len(chunk)
            if len(chunk) == 1 and len(chunk[0]) >= 2:
                cut = rng.randint(1, len(chunk[0]) - 1)
                chunk = [chunk[0][:cut], chunk[0][cut:]]  # pieces of one segment: the second follows the first
            split = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for segment in chunk[:split] for t in segment]
            is_random = len(chunk) == 1 or rng.random() < 0.5
            if is_random:
                b = random_run(documents, index, max(target - len(a), 1), rng)
                if whole_segments > 1:
                    i -= len(chunk) - split  # the unused segments start the next pair
            else:
                b = [t for segment in chunk[split:] for t in segment]
            truncate_pair(a, b, max_tokens, rng)
            if a and b:
                pairs.append(pair_example(a, b, is_random, *ids))
            chunk = []
        i += 1
    return pairs


def next_sentence_pairs(
    documents: Sequence[Sequence[str]],
    tokenizer,
    max_length: int = 128,
    short_seq_prob: float = 0.1,
    seed: int = 0,
) -> list[dict]:
    """NSP examples from documents given as lists of sentences: dicts of `input_ids`, `token_type_ids`,
    `special_tokens_mask` and `next_sentence_label`, each at most `max_length` tokens, ready for
    `masked_lm_collator` (which pads them and adds the MLM `labels`) and `ForPreTraining`."""
    if max_length < 5:
        raise ValueError(f"max_length must leave room for [CLS] A [SEP] B [SEP]: got {max_length}")
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        raise ValueError("next-sentence pairs need a tokenizer with [CLS] and [SEP] tokens (BERT's)")
    rng = random.Random(seed)
    tokenized = [
        [ids for ids in tokenizer(list(sentences), add_special_tokens=False)["input_ids"] if ids] if sentences else []
        for sentences in documents
    ]
    ids = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    return [
        pair
        for index in range(len(tokenized))
        for pair in document_pairs(tokenized, index, max_length, short_seq_prob, rng, ids)
    ]
