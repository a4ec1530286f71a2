"""Unpadded execution equals the padded layout (forward and gradients) for every encoder that unpads: ragged
batches, a batch with no padding, a length-1 sequence, left padding; with gradient checkpointing and training;
hidden states and attention weights; the pure index helpers."""

import itertools

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from fivefold.architectures import ARCHITECTURES
from fivefold.conversion.inputs import text_inputs
from fivefold.modeling.kernels import unpads
from fivefold.modeling.padding import PackedSequences

TOL = 1e-4
# Every architecture whose config has the `unpad_inputs` switch.
ENCODERS = [arch.stock_model_type for arch in ARCHITECTURES if hasattr(arch.config_class(**arch.tiny), "unpad_inputs")]


def _models(converted, model_type):
    """The same weights twice, in training mode without dropout: padded (unpad_inputs=False) and unpadded."""
    arch = next(a for a in ARCHITECTURES if a.stock_model_type == model_type)
    _, dst = converted(model_type, arch.base_model.__name__.removeprefix("Fivefold"))
    padded, unpadded = (
        arch.base_model.from_pretrained(dst, attn_implementation="sdpa", unpad_inputs=unpad).train()
        for unpad in (False, True)
    )
    for module in [*padded.modules(), *unpadded.modules()]:  # whatever the config calls its dropout rates
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return padded, unpadded


def _batches(config) -> dict[str, dict]:
    ragged = text_inputs(config, batch=4, length=12)
    if not getattr(config, "type_vocab_size", 0):
        ragged.pop("token_type_ids")
    ids, mask = ragged["input_ids"], ragged["attention_mask"]
    pad = config.pad_token_id
    single = mask.clone()
    single[1] = 0
    single[1, 0] = 1  # a length-1 sequence
    return {
        "ragged": {"input_ids": ids, "attention_mask": mask},
        "no padding": {"input_ids": ids[:, :4], "attention_mask": torch.ones_like(mask[:, :4])},
        "length 1": {"input_ids": ids.masked_fill(single == 0, pad), "attention_mask": single},
        "left padded": {"input_ids": ids.flip(1), "attention_mask": mask.flip(1)},
    }


def _forward_backward(model, inputs):
    model.zero_grad()
    out = model(**inputs, output_hidden_states=True)
    real = inputs["attention_mask"].bool()
    weights = torch.linspace(-1, 1, out.last_hidden_state.shape[-1])
    (out.last_hidden_state[real] * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("model_type", ENCODERS)
def test_unpadded_equals_padded_forward_and_gradients(converted, model_type):
    padded, unpadded = _models(converted, model_type)
    for name, inputs in _batches(padded.config).items():
        real = inputs["attention_mask"].bool()
        expected, expected_grads = _forward_backward(padded, inputs)
        got, grads = _forward_backward(unpadded, inputs)
        assert unpads(unpadded.config, inputs["attention_mask"]) == (name != "no padding"), name
        assert (expected.last_hidden_state - got.last_hidden_state)[real].abs().max() <= TOL, name
        assert len(got.hidden_states) == len(expected.hidden_states) == padded.config.num_hidden_layers + 1
        for a, b in zip(expected.hidden_states, got.hidden_states, strict=True):
            assert a.shape == b.shape and (a - b)[real].abs().max() <= TOL, name
        assert set(grads) == set(expected_grads) and len(grads) > 10
        for key, grad in expected_grads.items():
            assert (grad - grads[key]).abs().max() <= TOL * max(1.0, float(grad.abs().max())), (name, key)


@pytest.mark.parametrize("model_type", ENCODERS)
def test_a_hook_on_the_word_embeddings_sees_the_padded_layout(converted, model_type):
    """NEFTune (Trainer's `neftune_noise_alpha`) hooks the input embeddings and sizes its noise by their output's
    shape: the table is looked up before the batch is unpadded, so the noise is stock's, draw for draw."""
    from transformers.integrations.neftune import neftune_post_forward_hook

    padded, unpadded = _models(converted, model_type)
    inputs = _batches(padded.config)["ragged"]
    outputs = []
    for model in (padded, unpadded):
        table, seen = model.get_input_embeddings(), []
        table.neftune_noise_alpha = 5.0
        hooks = [table.register_forward_hook(neftune_post_forward_hook)]
        hooks.append(table.register_forward_hook(lambda module, args, out, seen=seen: seen.append(tuple(out.shape))))
        torch.manual_seed(0)
        with torch.no_grad():
            outputs.append(model(**inputs).last_hidden_state)
        assert seen == [(*inputs["input_ids"].shape, padded.config.hidden_size)]
        for hook in hooks:
            hook.remove()
    real = inputs["attention_mask"].bool()
    assert (outputs[0] - outputs[1])[real].abs().max() <= TOL


@pytest.mark.parametrize("model_type", ENCODERS)
def test_gradient_checkpointing_and_a_training_step(converted, model_type):
    padded, unpadded = _models(converted, model_type)
    inputs = _batches(padded.config)["ragged"]
    _, expected = _forward_backward(padded, inputs)
    unpadded.gradient_checkpointing_enable()
    _, grads = _forward_backward(unpadded, inputs)
    for key, grad in expected.items():
        assert (grad - grads[key]).abs().max() <= TOL * max(1.0, float(grad.abs().max())), key
    before = unpadded.layers[0].attn.q_proj.weight.detach().clone()
    torch.optim.SGD(unpadded.parameters(), lr=0.1).step()
    assert not torch.equal(before, unpadded.layers[0].attn.q_proj.weight)


def test_eager_keeps_the_padded_layout_and_returns_attention_weights(converted):
    _, dst = converted("bert", "BertModel")
    model = ARCHITECTURES[0].base_model.from_pretrained(dst, attn_implementation="eager").eval()
    inputs = _batches(model.config)["ragged"]
    assert model.config.unpad_inputs and not unpads(model.config, inputs["attention_mask"])
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    assert len(out.attentions) == model.config.num_hidden_layers and out.attentions[0].shape[-1] == 12


def test_dropout_runs_on_packed_tokens(converted):
    """Training with dropout: padded positions stay zero and real ones vary with the seed."""
    arch = next(a for a in ARCHITECTURES if a.stock_model_type == "bert")
    _, dst = converted("bert", "BertModel")
    model = arch.base_model.from_pretrained(dst, hidden_dropout_prob=0.3).train()
    inputs = _batches(model.config)["ragged"]
    torch.manual_seed(0)
    a = model(**inputs).last_hidden_state
    torch.manual_seed(1)
    b = model(**inputs).last_hidden_state
    pads = inputs["attention_mask"] == 0
    assert bool((a[pads] == 0).all()) and not torch.allclose(a[~pads], b[~pads])


def test_packing_helpers_round_trip():
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1]])
    packed = PackedSequences.from_mask(mask)
    assert packed.num_tokens == 9 and packed.max_seqlen == 4
    assert packed.cu_seqlens.tolist() == [0, 3, 5, 9] and packed.cu_seqlens.dtype == torch.int32
    assert packed.bounds == ((0, 3), (3, 5), (5, 9))
    x = torch.arange(16.0).view(4, 4, 1)
    flat = packed.unpad(x)
    assert flat.shape == (1, 9, 1) and flat[0, :, 0].tolist() == [0, 1, 2, 9, 10, 12, 13, 14, 15]
    assert torch.equal(packed.pad(flat), x * mask[..., None])
    assert packed.unpad(torch.arange(4)[None]).tolist() == [[0, 1, 2, 1, 2, 0, 1, 2, 3]]  # [1, T] broadcast
    windowed = packed.with_window(1)
    ((queries, keys, band),) = windowed.attention_blocks(0, 3)
    assert (queries, keys) == (slice(0, 3), slice(0, 3))
    assert band.tolist() == [[True, True, False], [True, True, True], [False, True, True]]
    assert windowed.attention_blocks(3, 5)[0][2] is None  # the window covers the sequence
    assert packed.attention_blocks(5, 9) == ((slice(5, 9), slice(5, 9), None),)  # no window


def test_a_sequence_longer_than_four_windows_attends_in_blocks():
    """Blocks of `window` queries, each over the keys a window either side: together exactly the band."""
    mask = torch.ones(2, 23, dtype=torch.long)
    mask[1, :4] = 0  # left padding: positions start at 4
    packed = PackedSequences.from_mask(mask).with_window(3)
    for start, end in packed.bounds:
        blocks = packed.attention_blocks(start, end)
        assert [(q.start, q.stop) for q, _, _ in blocks] == [(q, min(q + 3, end)) for q in range(start, end, 3)]
        assert all(k.start == max(start, q.start - 3) and k.stop == min(end, q.stop + 3) for q, k, _ in blocks)
        full = torch.zeros(end - start, end - start, dtype=torch.bool)
        for queries, keys, band in blocks:
            rows = slice(queries.start - start, queries.stop - start)
            full[rows, keys.start - start : keys.stop - start] = True if band is None else band
        pos = packed.columns[start:end]
        assert torch.equal(full, (pos[:, None] - pos[None, :]).abs() <= 3)
    short = PackedSequences.from_mask(torch.ones(1, 12, dtype=torch.long)).with_window(3)
    assert len(short.attention_blocks(0, 12)) == 1  # four windows or fewer: one block
    assert len(short.with_window(0).attention_blocks(0, 12)) == 1  # a window of 0: one block, its diagonal band


def test_flash_kernels_get_varlen_arguments(converted, monkeypatch):
    """No GPU here: a stand-in registered under a flash name, computing what flash-attention's varlen kernel
    computes from the same arguments (sequence boundaries, window_size = (w - 1, w - 1)), must reproduce sdpa."""
    seen = []

    def fake_flash(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, **kw):
        assert attention_mask is None and kw["cu_seq_lens_q"].dtype == torch.int32
        seen.append((sliding_window, kw["cu_seq_lens_q"].tolist(), kw["max_length_q"]))
        edges = kw["cu_seq_lens_q"].tolist()
        outs = []
        for s, e in itertools.pairwise(edges):
            scores = query[0, :, s:e] @ key[0, :, s:e].transpose(-1, -2) * scaling  # [H, L, L]
            if sliding_window is not None:
                pos = torch.arange(e - s)
                scores = scores.masked_fill((pos[:, None] - pos[None, :]).abs() > sliding_window - 1, float("-inf"))
            outs.append((scores.softmax(-1) @ value[0, :, s:e]).transpose(0, 1))  # [L, H, D]
        return torch.cat(outs)[None], None

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "flash_stand_in", fake_flash)
    padded, unpadded = _models(converted, "modernbert")
    inputs = _batches(padded.config)["ragged"]
    with torch.no_grad():
        expected = unpadded(**inputs).last_hidden_state
        unpadded.config._attn_implementation = "flash_stand_in"
        got = unpadded(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    assert (expected - got)[real].abs().max() <= 1e-5
    lengths = inputs["attention_mask"].sum(1)
    window = padded.config.sliding_window
    assert {w for w, _, _ in seen} == {None, window + 1}
    assert all(cu == [0, *lengths.cumsum(0).tolist()] and m == int(lengths.max()) for _, cu, m in seen)
