"""Packing: documents end to end in one row, as transformers' DataCollatorWithFlattening writes them (position ids
restarting per document, no attention mask). Encoders (BERT, RoBERTa, ModernBERT, sdpa on CPU) run them on the
unpadded path, decoders (GPT-2, Mixtral) on transformers' packed causal masks. In both, every document sees only
itself: the packed hidden states equal each document's own, and the packed loss (a mean over the row's labelled
tokens) times their count equals the sum of the per-document losses times theirs."""

import pytest
import torch
import transformers
from transformers import DataCollatorWithFlattening

from fivefold import PackedMaskedLMCollator, masked_lm_collator
from fivefold.modeling.padding import PackedSequences, is_packed_row

from helpers import minilm_folder

LENGTHS = (7, 12, 3, 9)
ENCODERS = [("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM"), ("modernbert", "ModernBertForMaskedLM")]
DECODERS = [("gpt2", "GPT2LMHeadModel"), ("mixtral", "MixtralForCausalLM")]


def documents(vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(5, vocab, (n,), generator=gen).tolist() for n in LENGTHS]


def mlm_labels(ids: list[int], seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.rand(len(ids), generator=gen) < 0.4
    chosen[1] = True  # at least one label per document; never the first token, the flattening's separator
    chosen[0] = False
    return [t if c else -100 for t, c in zip(ids, chosen.tolist(), strict=True)]


def position_start(config) -> int:
    """RoBERTa counts positions from padding_idx + 1 (DataCollatorWithFlattening's `position_ids_start`)."""
    return config.pad_token_id + 1 if config.model_type == "fivefold_roberta" else 0


def loss_total(loss: torch.Tensor, labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """A mean loss back to the sum over its labelled tokens."""
    counted = labels[..., 1:] if shift else labels
    return loss * (counted != -100).sum()


def test_packed_row_boundaries_follow_the_positions():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    packed = PackedSequences.from_position_ids(positions)
    assert packed.bounds == ((0, 3), (3, 5), (5, 9)) and packed.max_seqlen == 4
    assert packed.cu_seqlens.tolist() == [0, 3, 5, 9] and packed.cu_seqlens.dtype == torch.int32
    assert is_packed_row(positions, None)
    assert not is_packed_row(positions, torch.ones(1, 9))  # a mask: an ordinary row
    assert not is_packed_row(torch.arange(9)[None], None)  # one document
    assert is_packed_row(torch.tensor([[2, 3, 4, 2, 3]]), None)  # RoBERTa's positions start at 2


@pytest.mark.parametrize("model_type,stock_class", ENCODERS, ids=[e[0] for e in ENCODERS])
def test_packed_encoder_equals_each_document_alone(converted, model_type, stock_class):
    _, dst = converted(model_type, stock_class)
    model = transformers.AutoModelForMaskedLM.from_pretrained(dst, attn_implementation="sdpa").eval()
    docs = documents(model.config.vocab_size)
    labels = [mlm_labels(d, seed=i) for i, d in enumerate(docs)]
    flatten = DataCollatorWithFlattening(position_ids_start=position_start(model.config))
    batch = flatten([{"input_ids": d, "labels": y} for d, y in zip(docs, labels, strict=True)])
    assert batch["input_ids"].shape == (1, sum(LENGTHS)) and "attention_mask" not in batch
    with torch.no_grad():
        packed = model(**batch, output_hidden_states=True)
        alone = [
            model(input_ids=torch.tensor([d]), labels=torch.tensor([y])) for d, y in zip(docs, labels, strict=True)
        ]
        across = model(input_ids=batch["input_ids"], labels=batch["labels"])  # one long document
    expected = torch.cat([out.logits[0] for out in alone])
    assert (packed.logits[0] - expected).abs().max() < 1e-4
    assert not torch.allclose(across.logits[0], expected, atol=1e-2)  # attention across documents would show
    total = sum(loss_total(out.loss, torch.tensor(y), shift=False) for out, y in zip(alone, labels, strict=True))
    assert loss_total(packed.loss, batch["labels"], shift=False) == pytest.approx(float(total), rel=1e-5)
    assert packed.hidden_states[-1].shape == (1, sum(LENGTHS), model.config.hidden_size)


@pytest.mark.parametrize("model_type,stock_class", ENCODERS, ids=[e[0] for e in ENCODERS])
def test_packed_encoder_traces_with_torch_jit(converted, model_type, stock_class):
    """torch.jit.trace of a packed row records eager's path, each document on its own tokens, with the documents'
    bounds as constants (a trace keeps the sizes it saw): the same logits as eager. (It failed on the kernel's
    grouped-heads flag, which the trace's tensor shapes made a tensor.)"""
    _, dst = converted(model_type, stock_class)
    model = transformers.AutoModelForMaskedLM.from_pretrained(dst, attn_implementation="sdpa").eval()
    flatten = DataCollatorWithFlattening(position_ids_start=position_start(model.config))
    batch = flatten([{"input_ids": d} for d in documents(model.config.vocab_size)])
    with torch.no_grad():
        traced = torch.jit.trace(model, example_kwarg_inputs=dict(batch), strict=False)
        assert (traced(**batch)["logits"] - model(**batch).logits).abs().max() < 1e-4


@pytest.mark.slow  # dynamo and AOTAutograd: seconds a model
@pytest.mark.parametrize("model_type,stock_class", ENCODERS, ids=[e[0] for e in ENCODERS])
def test_packed_encoder_compiles_to_one_graph_equal_to_eager(converted, model_type, stock_class):
    """Compiled (one graph), a packed row keeps each document to itself in the mask, where eager runs each on its
    own tokens: the same logits. So does a row of one document with its position ids given."""
    _, dst = converted(model_type, stock_class)
    model = transformers.AutoModelForMaskedLM.from_pretrained(dst, attn_implementation="sdpa").eval()
    flatten = DataCollatorWithFlattening(position_ids_start=position_start(model.config))
    batch = flatten([{"input_ids": d} for d in documents(model.config.vocab_size)])
    one = {
        "input_ids": batch["input_ids"],
        "position_ids": torch.arange(sum(LENGTHS))[None] + position_start(model.config),
    }
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            for inputs in (batch, one):
                assert (compiled(**inputs).logits - model(**inputs).logits).abs().max() < 1e-4
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("model_type,stock_class", DECODERS, ids=[d[0] for d in DECODERS])
def test_packed_decoder_equals_each_document_alone(converted, model_type, stock_class):
    src, dst = converted(model_type, stock_class)
    model = transformers.AutoModelForCausalLM.from_pretrained(dst, attn_implementation="sdpa").eval()
    docs = documents(model.config.vocab_size)
    batch = DataCollatorWithFlattening()([{"input_ids": d} for d in docs])
    # Labels: each document's own tokens, the first one the separator, so no document predicts the next one's start.
    starts = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0)[:-1].tolist()])
    assert (batch["labels"][0, starts] == -100).all()
    with torch.no_grad():
        packed = model(**batch)  # use_cache on by default: a fresh cache must not undo the packing
        alone = [model(input_ids=torch.tensor([d]), labels=torch.tensor([d])) for d in docs]
        stock = getattr(transformers, stock_class).from_pretrained(src, attn_implementation="sdpa").eval()
        stock_packed = stock(**batch, use_cache=False)
    expected = torch.cat([out.logits[0] for out in alone])
    assert (packed.logits[0] - expected).abs().max() < 1e-4
    assert (packed.logits - stock_packed.logits).abs().max() < 1e-4  # stock's packed run, the same
    total = sum(loss_total(out.loss, torch.tensor(d), shift=True) for out, d in zip(alone, docs, strict=True))
    assert loss_total(packed.loss, batch["labels"], shift=True) == pytest.approx(float(total), rel=1e-5)


@pytest.mark.parametrize("model_type,stock_class", DECODERS[:1], ids=["gpt2"])
def test_packed_decoder_gradients_equal_the_documents_summed(converted, model_type, stock_class):
    _, dst = converted(model_type, stock_class)
    model = transformers.AutoModelForCausalLM.from_pretrained(dst, attn_implementation="sdpa").eval()
    docs = documents(model.config.vocab_size, seed=1)
    batch = DataCollatorWithFlattening()([{"input_ids": d} for d in docs])
    loss_total(model(**batch).loss, batch["labels"], shift=True).backward()
    packed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for d in docs:
        ids = torch.tensor([d])
        loss_total(model(input_ids=ids, labels=ids).loss, ids, shift=True).backward()
    for got, want in zip(packed, (p.grad for p in model.parameters()), strict=True):
        assert (got - want).abs().max() < 1e-4


def test_packed_masked_lm_collator_masks_then_flattens(converted):
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_folder())
    texts = ["the cat sat on the mat", "a dog ran far away from the big red barn today", "short one"]
    examples = [tokenizer(t) for t in texts]
    collate = PackedMaskedLMCollator(masked_lm_collator(tokenizer, mlm_probability=0.5, seed=0))
    batch = collate(examples)
    lengths = [len(e["input_ids"]) for e in examples]
    assert batch["input_ids"].shape == batch["labels"].shape == (1, sum(lengths))
    assert batch["position_ids"][0].tolist() == [i for n in lengths for i in range(n)]
    chosen = batch["labels"][0] != -100
    original = torch.tensor([t for e in examples for t in e["input_ids"]])
    assert 0 < chosen.sum() and torch.equal(batch["labels"][0][chosen], original[chosen])
    special = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    assert not (chosen & special).any()
    assert (batch["input_ids"][0][~chosen] == original[~chosen]).all()
