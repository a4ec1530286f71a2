"""Span corruption: the statistics hold over a large batch, inputs + targets give back the text exactly, sentinels
never collide with real tokens, a seed fixes the corruption, and a few Trainer steps of pre-training help."""

import pytest
import torch
from transformers import T5Tokenizer, Trainer, TrainingArguments

from fivefold import DataCollatorForSpanCorruption, FivefoldT5Config, FivefoldT5ForConditionalGeneration
from fivefold.span_corruption import random_spans_noise_mask, span_starts

WORDS = "the quick brown fox jumps over lazy dog a cat sat on mat and ran far away from big red barn".split()


def tiny_tokenizer(extra_ids: int = 100) -> T5Tokenizer:
    """A real T5 (unigram) tokenizer, built offline: pad, EOS, unk, words, letters, then the sentinels."""
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [(f"▁{w}", -1.0) for w in WORDS] + [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in reversed(range(extra_ids))]
    return T5Tokenizer(vocab=vocab, extra_ids=extra_ids)


def sentences(n: int, seed: int = 0) -> list[str]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 60, (n,), generator=gen)
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (int(k),), generator=gen)) for k in lengths]


def reconstruct(inputs: list[int], targets: list[int], sentinels: set[int], eos: int) -> list[int]:
    """Fill each sentinel of the input with the tokens after the same sentinel in the target."""
    spans, current = {}, None
    for token in targets:
        if token in sentinels:
            current = spans.setdefault(token, [])
        elif token != eos:
            current.append(token)
    out = []
    for token in inputs:
        out.extend(spans[token] if token in sentinels else [token])
    return out


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_noise_density_and_span_length_hold_over_a_large_batch():
    gen = torch.Generator().manual_seed(0)
    noise_tokens = tokens = spans = 0
    for length in torch.randint(50, 400, (600,), generator=gen).tolist():
        mask = random_spans_noise_mask(length, 0.15, 3.0, gen)
        assert mask.shape == (length,) and not mask[0]  # starts with kept tokens
        starts = span_starts(mask)
        noise_tokens, tokens, spans = noise_tokens + int(mask.sum()), tokens + length, spans + int(starts.sum())
    assert abs(noise_tokens / tokens - 0.15) < 0.005
    assert abs(noise_tokens / spans - 3.0) < 0.1


def test_inputs_and_targets_reconstruct_the_text_exactly(tokenizer):
    texts = sentences(64)
    examples = [tokenizer(t) for t in texts]
    batch = DataCollatorForSpanCorruption(tokenizer, seed=0)(examples)
    sentinels = {tokenizer.convert_tokens_to_ids(f"<extra_id_{i}>") for i in range(100)}
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    for row, (example, text) in enumerate(zip(examples, texts, strict=True)):
        inputs = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
        targets = [t for t in batch["labels"][row].tolist() if t != -100]
        assert inputs[-1] == eos and targets[-1] == eos and pad not in inputs[:-1]
        used = [t for t in inputs if t in sentinels]
        assert used and used == [t for t in targets if t in sentinels]  # same sentinels, same order
        assert used == [tokenizer.convert_tokens_to_ids(f"<extra_id_{i}>") for i in range(len(used))]
        original = example["input_ids"][:-1]  # without its EOS
        assert reconstruct(inputs[:-1], targets, sentinels, eos) == original
        assert tokenizer.decode(original) == text


def test_no_sentinel_collides_with_a_real_token(tokenizer):
    sentinels = {tokenizer.convert_tokens_to_ids(f"<extra_id_{i}>") for i in range(100)}
    real = set(tokenizer(" ".join(WORDS + list("abcdefghijklmnopqrstuvwxyz"))).input_ids)
    assert len(sentinels) == 100 and not sentinels & real
    assert tokenizer.unk_token_id not in sentinels
    collator = DataCollatorForSpanCorruption(tokenizer, seed=0)
    poisoned = tokenizer("the quick brown fox jumps over the lazy dog and ran far away").input_ids
    poisoned[3] = tokenizer.convert_tokens_to_ids("<extra_id_0>")
    with pytest.raises(ValueError, match="sentinel"):
        collator([{"input_ids": poisoned}])
    with pytest.raises(ValueError, match="no sentinel token"):  # too few sentinels for the spans
        DataCollatorForSpanCorruption(tiny_tokenizer(extra_ids=1), noise_density=0.5, mean_noise_span_length=1.0)(
            [tokenizer(sentences(1)[0])]
        )


def test_a_seed_fixes_the_corruption(tokenizer):
    examples = [tokenizer(t) for t in sentences(8)]
    a = DataCollatorForSpanCorruption(tokenizer, seed=1)(examples)
    b = DataCollatorForSpanCorruption(tokenizer, seed=1)(examples)
    c = DataCollatorForSpanCorruption(tokenizer, seed=2)(examples)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["input_ids"], c["input_ids"])
    with pytest.raises(ValueError, match="noise_density"):
        DataCollatorForSpanCorruption(tokenizer, noise_density=1.5)


def test_trainer_steps_of_span_corruption_lower_the_loss(tokenizer, tmp_path):
    torch.manual_seed(0)
    config = FivefoldT5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        dropout_rate=0.0, decoder_start_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = FivefoldT5ForConditionalGeneration(config)
    train = [{"input_ids": tokenizer(t).input_ids} for t in sentences(64, seed=1)]
    collator = DataCollatorForSpanCorruption(tokenizer, seed=0)
    held_out = DataCollatorForSpanCorruption(tokenizer, seed=123)([tokenizer(t) for t in sentences(16, seed=2)])

    def loss() -> float:
        model.eval()
        with torch.no_grad():
            return float(model(**held_out).loss)

    before = loss()
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=16, learning_rate=3e-2, report_to=[],
        save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=train, data_collator=collator).train()
    after = loss()
    assert after < before - 0.5, (before, after)
