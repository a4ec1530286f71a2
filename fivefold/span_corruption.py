"""T5's pre-training objective: span corruption, as a data collator for `Trainer` (or any DataLoader).

For each tokenised example, about `noise_density` of the tokens are dropped in spans of mean length
`mean_noise_span_length`; each span is replaced in the input by one sentinel (`<extra_id_0>`, `<extra_id_1>`, ...
from the tokenizer), and the target lists every sentinel followed by the tokens it replaced, then EOS:

    tokens   the quick brown fox jumps over the lazy dog
    input    the quick <extra_id_0> jumps over the <extra_id_1> dog </s>
    target   <extra_id_0> brown fox <extra_id_1> lazy </s>

Span lengths follow T5's `random_spans_noise_mask`: the noise and non-noise token counts are each split into the
same number of random non-empty segments, which alternate (non-noise first). Shapes: B batch, L length.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch


def random_segment_lengths(num_items: int, num_segments: int, generator: torch.Generator) -> torch.Tensor:
    """`num_items` split into `num_segments` random positive lengths summing to it."""
    cuts = torch.randperm(num_items - 1, generator=generator)[: num_segments - 1] + 1  # distinct cut points
    bounds = torch.cat([torch.tensor([0]), cuts.sort().values, torch.tensor([num_items])])
    return bounds.diff()


def random_spans_noise_mask(
    length: int, noise_density: float, mean_noise_span_length: float, generator: torch.Generator
) -> torch.Tensor:
    """[L] bool, True for dropped tokens: round(length * noise_density) of them (at least one, never all) in
    round(noise / mean_noise_span_length) spans (at least one), the sequence starting with kept tokens."""
    if length < 2:
        return torch.zeros(length, dtype=torch.bool)
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    num_spans = min(max(round(num_noise / mean_noise_span_length), 1), num_noise, length - num_noise)
    noise_lengths = random_segment_lengths(num_noise, num_spans, generator)
    keep_lengths = random_segment_lengths(length - num_noise, num_spans, generator)
    span_lengths = torch.stack([keep_lengths, noise_lengths], dim=1).reshape(-1)  # keep, noise, keep, noise...
    is_noise = torch.tensor([False, True]).repeat(num_spans)
    return is_noise.repeat_interleave(span_lengths)


def sentinel_ids(tokenizer, count: int) -> list[int]:
    """The ids of `<extra_id_0>` ... `<extra_id_{count-1}>`; a clear error when the tokenizer lacks them."""
    ids = tokenizer.convert_tokens_to_ids([f"<extra_id_{i}>" for i in range(count)])
    unknown = [i for i, token_id in enumerate(ids) if token_id is None or token_id == tokenizer.unk_token_id]
    if unknown:
        raise ValueError(
            f"the tokenizer has no sentinel token <extra_id_{unknown[0]}>; span corruption needs "
            f"<extra_id_0> ... <extra_id_{count - 1}> (T5 tokenizers have 100)"
        )
    return ids


def span_starts(noise: torch.Tensor) -> torch.Tensor:
    """[L] bool: True on the first token of each noise span."""
    return noise & ~torch.cat([torch.tensor([False]), noise[:-1]])


def corrupt(tokens: torch.Tensor, noise: torch.Tensor, sentinels: list[int], eos: int) -> tuple[list[int], list[int]]:
    """One example: (input ids, target ids) for a [L] token sequence and its [L] noise mask."""
    starts = span_starts(noise)
    span_index = starts.long().cumsum(0) - 1  # which span a noise token belongs to
    inputs, targets = [], []
    rows = zip(tokens.tolist(), noise.tolist(), starts.tolist(), span_index.tolist(), strict=True)
    for token, is_noise, is_start, span in rows:
        if is_start:
            inputs.append(sentinels[span])
            targets.append(sentinels[span])
        (targets if is_noise else inputs).append(token)
    return [*inputs, eos], [*targets, eos]


@dataclass
class DataCollatorForSpanCorruption:
    """Collates examples holding `input_ids` (lists or tensors, EOS at the end or not) into
    `input_ids`, `attention_mask` and `labels` (padded with -100) for a T5 `ForConditionalGeneration`, which
    builds its decoder inputs from the labels.

    Deterministic under `seed`: the same seed gives the same corruption for the same sequence of batches. With
    several DataLoader workers each worker holds a copy of the generator, so give each its own seed if the
    workers must differ.
    """

    tokenizer: object  # needs eos_token_id, pad_token_id and the <extra_id_N> sentinels
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    seed: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = -100
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.noise_density < 1.0:
            raise ValueError(f"noise_density must lie in (0, 1), got {self.noise_density}")
        if self.mean_noise_span_length < 1.0:
            raise ValueError(f"mean_noise_span_length must be at least 1, got {self.mean_noise_span_length}")
        if self.tokenizer.eos_token_id is None or self.tokenizer.pad_token_id is None:
            raise ValueError("span corruption needs a tokenizer with an EOS and a padding token")
        self.generator = torch.Generator()
        self.generator.manual_seed(self.seed if self.seed is not None else torch.seed())

    def _tokens(self, example) -> torch.Tensor:
        ids = example["input_ids"] if isinstance(example, Mapping) else example
        tokens = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        if len(tokens) and tokens[-1] == self.tokenizer.eos_token_id:
            tokens = tokens[:-1]  # EOS is not corrupted; it ends both input and target
        return tokens

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        pairs = []
        for example in examples:
            tokens = self._tokens(example)
            noise = random_spans_noise_mask(
                len(tokens), self.noise_density, self.mean_noise_span_length, self.generator
            )
            sentinels = sentinel_ids(self.tokenizer, int(span_starts(noise).sum()))
            if torch.isin(tokens, torch.tensor(sentinels, dtype=torch.long)).any():
                raise ValueError("an example already holds a sentinel token (<extra_id_N>): it would be ambiguous")
            pairs.append(corrupt(tokens, noise, sentinels, eos))
        return {
            **self._pad([inputs for inputs, _ in pairs], pad, "input_ids"),
            "labels": self._pad([targets for _, targets in pairs], self.label_pad_token_id, "labels")["labels"],
        }

    def _pad(self, rows: list[list[int]], value: int, name: str) -> dict[str, torch.Tensor]:
        width = max(len(row) for row in rows)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        ids = torch.full((len(rows), width), value, dtype=torch.long)  # [B, L]
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        return {name: ids, "attention_mask": mask}
