"""T5 against stock transformers on the same tiny random weights, through the production converter: both flavours
(v1.0 relu + tied head with output scaling; v1.1 gated-gelu + untied head), unequal depths, padded batches,
losses, cached decoding, and generate() (greedy, beam, sampling) identical to stock; gradient checkpointing; the
shipped code of the v1.1 flavour; old files (also at the public sizes, t5-small and flan-t5-base, on the meta
device)."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import fivefold
from fivefold import FivefoldT5Config, FivefoldT5ForConditionalGeneration
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.samples import build_stock_checkpoint
from fivefold.conversion.verify import compare, verify
from fivefold.modeling.relative_position import RelativePositionBias, relative_position_bucket

from helpers import (
    NO_FIVEFOLD,
    RemoteJob,
    minilm_folder,
    plan_on_meta,
    public_stock_model,
    run_without_fivefold,
    shapes_on_disk,
    stock_parameters,
)

TOL = 1e-4
ARCH = architecture_for_model_type("t5")
V11 = dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def untie_head(folder, seed: int = 5):
    """What public v1.1 / FLAN files hold: an `lm_head` of its own and `tie_word_embeddings: false`."""
    weights = load_file(folder / "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    weights["lm_head.weight"] = weights["shared.weight"] + torch.randn(weights["shared.weight"].shape, generator=gen)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config.pop("scale_decoder_outputs", None)
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """flavour -> (stock folder, converted folder) for T5ForConditionalGeneration; the decoder is deeper (3 vs 2)."""
    out = {}
    for flavour, overrides in {"v1.0": {}, "v1.1": V11}.items():
        root = tmp_path_factory.mktemp(f"t5-{flavour}")
        src = build_stock_checkpoint("t5", "T5ForConditionalGeneration", root / "stock", **overrides)
        if flavour == "v1.1":
            untie_head(src)
        out[flavour] = (src, fivefold.convert(src, root / "fivefold", progress=False))
    return out


def _models(src, dst, attn="sdpa"):
    stock = transformers.T5ForConditionalGeneration.from_pretrained(src, attn_implementation=attn).eval()
    ours = transformers.AutoModelForSeq2SeqLM.from_pretrained(dst, attn_implementation=attn).eval()
    return stock, ours


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("flavour", ["v1.0", "v1.1"])
def test_seq2seq_lm_matches_stock(checkpoints, flavour, attn):
    src, dst = checkpoints[flavour]
    stock, ours = _models(src, dst, attn)
    assert type(ours).__name__ == "FivefoldT5ForConditionalGeneration"
    assert ours.config.num_decoder_layers == 3 != ours.config.num_layers
    tied = ours.lm_head.weight.data_ptr() == ours.shared.weight.data_ptr()
    assert tied == (flavour == "v1.0") and ours.config.scale_decoder_outputs == (flavour == "v1.0")
    inputs = ARCH.sample_inputs(stock.config, "T5ForConditionalGeneration", 0)
    assert inputs["attention_mask"].min() == 0 and (inputs["labels"] == -100).any()
    diffs = compare(stock, ours, inputs)
    assert {"loss", "logits", "encoder_last_hidden_state", "decoder_hidden_states[3]"} <= set(diffs)
    assert max(diffs.values()) <= TOL, diffs


def test_decoder_padding_and_left_padded_encoder_match_stock(checkpoints):
    stock, ours = _models(*checkpoints["v1.1"])
    inputs = ARCH.sample_inputs(stock.config, "T5Model", 0)
    inputs = {"input_ids": inputs["input_ids"].flip(1), "attention_mask": inputs["attention_mask"].flip(1)}
    decoder = torch.randint(2, 99, (3, 6))
    decoder_mask = (torch.arange(6)[None] < torch.tensor([[6], [4], [2]])).long()
    with torch.no_grad():
        a = stock(**inputs, decoder_input_ids=decoder, decoder_attention_mask=decoder_mask).logits
        b = ours(**inputs, decoder_input_ids=decoder, decoder_attention_mask=decoder_mask).logits
    assert (a - b)[decoder_mask.bool()].abs().max() <= TOL


def test_return_dict_set_on_the_config_after_loading_gives_stocks_tuple(checkpoints):
    """Stock's stacks hold copies of the config; fivefold's share the model's, whose `return_dict = False` must
    change only what the model returns, not what its stacks hand each other."""
    stock, ours = _models(*checkpoints["v1.1"])
    inputs = ARCH.sample_inputs(stock.config, "T5ForConditionalGeneration", 0)
    for model in (stock, ours):
        model.config.return_dict = False
    with torch.no_grad():
        a, b = stock(**inputs), ours(**inputs)
    assert isinstance(b, tuple) and len(a) == len(b)
    assert (a[0] - b[0]).abs().max() <= TOL and (a[1] - b[1]).abs().max() <= TOL  # the loss and the logits
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    with torch.no_grad():  # the encoder alone, as code taking sentence embeddings from a T5 calls it
        a, b = (m.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state for m in (stock, ours))
    assert (a - b)[mask.bool()].abs().max() <= TOL


def test_cached_decoding_equals_one_full_forward(checkpoints):
    _, ours = _models(*checkpoints["v1.0"])
    inputs = ARCH.sample_inputs(ours.config, "T5Model", 0)
    with torch.no_grad():
        full = ours(**inputs)
        encoder_outputs = (full.encoder_last_hidden_state,)
        cache, steps = None, []
        for t in range(inputs["decoder_input_ids"].shape[1]):
            out = ours(
                encoder_outputs=encoder_outputs,
                attention_mask=inputs["attention_mask"],
                decoder_input_ids=inputs["decoder_input_ids"][:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            steps.append(out.logits)
    assert cache.is_updated[0] and cache.self_attention_cache.get_seq_length() == 7
    assert (torch.cat(steps, dim=1) - full.logits).abs().max() <= 1e-5


GENERATE = {
    "greedy": dict(do_sample=False, num_beams=1),
    "beam": dict(do_sample=False, num_beams=3, num_return_sequences=2),
}


@pytest.fixture(scope="module")
def generating(tmp_path_factory):
    """flavour -> (stock, ours) with the deeper encoder (3 vs 2). Stock T5 in transformers 5.24 cannot generate
    when the decoder is deeper (its caches are sized by the encoder's depth); ours is tested on that below."""
    out = {}
    for flavour, overrides in {"v1.0": {}, "v1.1": V11}.items():
        root = tmp_path_factory.mktemp(f"t5-generate-{flavour}")
        overrides = {**overrides, "num_layers": 3, "num_decoder_layers": 2}
        src = build_stock_checkpoint("t5", "T5ForConditionalGeneration", root / "stock", seed=3, **overrides)
        if flavour == "v1.1":
            untie_head(src)
        out[flavour] = _models(src, fivefold.convert(src, root / "fivefold", progress=False))
    return out


@pytest.mark.parametrize("search", list(GENERATE))
@pytest.mark.parametrize("flavour", ["v1.0", "v1.1"])
def test_generate_matches_stock(generating, flavour, search, linear_path):
    stock, ours = generating[flavour]
    inputs = ARCH.sample_inputs(stock.config, "T5EncoderModel", 1)
    settings = dict(max_new_tokens=10, min_new_tokens=10, return_dict_in_generate=True, output_scores=True)
    a = stock.generate(**inputs, **settings, **GENERATE[search])
    b = ours.generate(**inputs, **settings, **GENERATE[search])
    assert torch.equal(a.sequences, b.sequences)
    assert len(set(b.sequences[:, 1:].flatten().tolist())) > 3  # not one token repeated
    for x, y in zip(a.scores, b.scores, strict=True):
        torch.testing.assert_close(x, y, atol=TOL, rtol=0)  # -inf (blocked EOS) equal on both sides
    uncached = ours.generate(**inputs, **settings, **GENERATE[search], use_cache=False)
    assert torch.equal(b.sequences, uncached.sequences)


def test_sampling_matches_stock_under_a_seed(generating):
    stock, ours = generating["v1.1"]
    inputs = ARCH.sample_inputs(stock.config, "T5EncoderModel", 2)
    settings = dict(max_new_tokens=8, do_sample=True, top_k=20, temperature=0.9)
    torch.manual_seed(7)
    a = stock.generate(**inputs, **settings)
    torch.manual_seed(7)
    b = ours.generate(**inputs, **settings)
    assert torch.equal(a, b)


def test_deeper_decoder_generates_cached_as_uncached(checkpoints):
    _, ours = _models(*checkpoints["v1.1"])
    inputs = ARCH.sample_inputs(ours.config, "T5EncoderModel", 0)
    for search in GENERATE.values():
        cached = ours.generate(**inputs, max_new_tokens=8, min_new_tokens=8, **search)
        uncached = ours.generate(**inputs, max_new_tokens=8, min_new_tokens=8, use_cache=False, **search)
        assert torch.equal(cached, uncached)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_buckets_match_stock(bidirectional):
    relative = torch.arange(-300, 300)[None, :]
    for buckets, distance in [(32, 128), (8, 16), (6, 20)]:
        expected = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
            relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
        )
        assert torch.equal(relative_position_bucket(relative, bidirectional, buckets, distance), expected)


def test_bias_is_computed_once_per_stack_and_offset_by_the_cache(checkpoints):
    _, ours = _models(*checkpoints["v1.0"])
    biases = [m for m in ours.modules() if isinstance(m, RelativePositionBias)]
    assert [module.spec.bidirectional for module in biases] == [True, False]  # encoder, decoder
    calls = []
    for module in biases:
        module.register_forward_hook(lambda m, args, out: calls.append((m.spec.bidirectional, args)))
    inputs = ARCH.sample_inputs(ours.config, "T5EncoderModel", 0)
    with torch.no_grad():
        ours.generate(**inputs, max_new_tokens=3, min_new_tokens=3)
    # One call for the encoder, then one per decoding step, each for the new query after the cached ones.
    assert calls[0][0] and calls[0][1][:3] == (12, 12, 0)
    assert [args[:3] for bidirectional, args in calls[1:]] == [(1, 1, 0), (1, 2, 1), (1, 3, 2)]


def test_verify_convert_and_export_round_trip_both_flavours(checkpoints, tmp_path):
    for flavour, (src, dst) in checkpoints.items():
        assert max(verify(src, dst).values()) <= TOL
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(dst)
        model.save_pretrained(tmp_path / flavour)  # load -> save keeps our layout
        back = fivefold.export(tmp_path / flavour, tmp_path / f"{flavour}-stock", progress=False)
        original, exported = load_file(src / "model.safetensors"), load_file(back / "model.safetensors")
        assert set(original) == set(exported) and all(torch.equal(original[k], exported[k]) for k in original)
        stock = transformers.T5ForConditionalGeneration.from_pretrained(back)
        assert stock.config.scale_decoder_outputs == (flavour == "v1.0")


def test_stock_folder_loads_directly_and_old_files_convert(checkpoints, tmp_path):
    """`from_pretrained(stock folder)` converts in memory; files that also store each stack's `embed_tokens` and
    the unused cross-attention bias of old checkpoints convert too."""
    src, _ = checkpoints["v1.0"]
    weights = load_file(src / "model.safetensors")
    for stack in ("encoder", "decoder"):
        weights[f"{stack}.embed_tokens.weight"] = weights["shared.weight"].clone()
    weights["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = torch.zeros(8, 4)
    old = tmp_path / "old"
    old.mkdir()
    save_file(weights, old / "model.safetensors", metadata={"format": "pt"})
    (old / "config.json").write_text((src / "config.json").read_text())
    assert max(verify(src, fivefold.convert(old, tmp_path / "old-fivefold", progress=False)).values()) <= TOL
    direct = fivefold.FivefoldT5ForConditionalGeneration.from_pretrained(old).eval()
    inputs = ARCH.sample_inputs(direct.config, "T5ForConditionalGeneration", 0)
    stock = transformers.T5ForConditionalGeneration.from_pretrained(src).eval()
    with torch.no_grad():
        assert (direct(**inputs).logits - stock(**inputs).logits).abs().max() <= TOL


def test_wo_stays_fp32_under_fp16(checkpoints):
    _, dst = checkpoints["v1.1"]
    half = transformers.AutoModelForSeq2SeqLM.from_pretrained(dst, dtype=torch.float16).eval()
    assert half.encoder.layers[0].mlp.down_proj.weight.dtype == torch.float32
    assert half.encoder.layers[0].mlp.up_proj.weight.dtype == torch.float16
    full = transformers.AutoModelForSeq2SeqLM.from_pretrained(dst).eval()
    inputs = ARCH.sample_inputs(full.config, "T5ForConditionalGeneration", 0)
    with torch.no_grad():
        a, b = full(**inputs).logits, half(**inputs).logits
    assert b.dtype == torch.float16 and torch.isfinite(b).all()
    assert (a - b.float()).abs().max() <= 0.05 * a.abs().max()


def test_seq2seq_loss_uses_unshifted_labels_and_shifts_decoder_inputs(checkpoints):
    stock, ours = _models(*checkpoints["v1.0"])
    labels = torch.tensor([[5, 6, 7, -100], [8, 9, -100, -100]])
    assert torch.equal(ours.prepare_decoder_input_ids_from_labels(labels), stock._shift_right(labels))
    inputs = ARCH.sample_inputs(ours.config, "T5EncoderModel", 0)
    with torch.no_grad():
        out = ours(input_ids=inputs["input_ids"][:2], attention_mask=inputs["attention_mask"][:2], labels=labels)
        manual = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 99), labels.reshape(-1), ignore_index=-100)
    assert torch.allclose(out.loss, manual)


def test_text_encoding_and_bare_model_through_auto_classes(checkpoints, tmp_path):
    src = build_stock_checkpoint("t5", "T5EncoderModel", tmp_path / "enc", **V11)
    dst = fivefold.convert(src, tmp_path / "enc-fivefold", progress=False)
    encoder = transformers.AutoModelForTextEncoding.from_pretrained(dst)
    assert type(encoder).__name__ == "FivefoldT5EncoderModel" and not hasattr(encoder, "decoder")
    assert max(verify(src, dst).values()) <= TOL
    # the seq2seq checkpoint also loads as the bare model and as the encoder alone
    _, dst = checkpoints["v1.0"]
    bare = transformers.AutoModel.from_pretrained(dst)
    alone = transformers.AutoModelForTextEncoding.from_pretrained(dst)
    inputs = ARCH.sample_inputs(bare.config, "T5EncoderModel", 0)
    with torch.no_grad():
        a = bare(**inputs, decoder_input_ids=torch.zeros(3, 1, dtype=torch.long)).encoder_last_hidden_state
        b = alone(**inputs).last_hidden_state
    assert torch.equal(a, b)


def test_bad_inputs_raise_clear_errors(checkpoints):
    _, ours = _models(*checkpoints["v1.0"])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ours(input_ids=torch.tensor([[5, 120]]), decoder_input_ids=torch.tensor([[0]]))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        ours(input_ids=torch.tensor([[5, 6]]), attention_mask=torch.ones(1, 3), decoder_input_ids=torch.tensor([[0]]))


def test_attention_weights_match_stock(checkpoints):
    stock, ours = _models(*checkpoints["v1.1"], attn="eager")
    inputs = ARCH.sample_inputs(stock.config, "T5ForConditionalGeneration", 0)
    with torch.no_grad():
        a, b = stock(**inputs, output_attentions=True), ours(**inputs, output_attentions=True)
    for key, layers in [("encoder_attentions", 2), ("decoder_attentions", 3), ("cross_attentions", 3)]:
        assert len(getattr(b, key)) == layers
        for x, y in zip(getattr(a, key), getattr(b, key), strict=True):
            assert (x - y).abs().max() <= TOL


@pytest.mark.slow
def test_v1_1_forward_and_generate_as_remote_code(checkpoints, tmp_path):
    """The gated v1.1 flavour through the shipped code, where fivefold cannot be imported: the encoder-decoder
    modules travel, and forward and generate() give what they give with fivefold. (Every class of the tiny v1.0:
    test_remote_code.py.)"""
    _, dst = checkpoints["v1.1"]
    assert set(json.loads((dst / "config.json").read_text())["auto_map"]) == {"AutoConfig", *ARCH.auto_classes}
    shipped = {p.name for p in dst.glob("*.py")}
    assert {"modeling_t5.py", "modeling_encoder_decoder.py", "configuration_t5.py"} <= shipped
    ours = transformers.AutoModelForSeq2SeqLM.from_pretrained(dst).eval()
    inputs = ARCH.sample_inputs(ours.config, "T5Model", 0)
    prompt = {k: inputs[k] for k in ("input_ids", "attention_mask")}
    generating = dict(max_new_tokens=6)
    forward, generated = run_without_fivefold(
        tmp_path,
        [RemoteJob(dst, "AutoModelForSeq2SeqLM", inputs), RemoteJob(dst, "AutoModelForSeq2SeqLM", prompt, generating)],
    )
    assert forward["cls"] == generated["cls"] == "FivefoldT5ForConditionalGeneration"
    with torch.no_grad():  # the same code in another process, maybe on another number of threads: fp32's order
        torch.testing.assert_close(forward["outputs"]["logits"], ours(**inputs).logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(generated["outputs"]["sequences"], ours.generate(**prompt, **generating))


@pytest.mark.parametrize(
    ("hub_id", "stock_class"),
    [
        ("google-t5/t5-small", "T5ForConditionalGeneration"),
        ("google/flan-t5-base", "T5ForConditionalGeneration"),
        ("google/flan-t5-base", "T5EncoderModel"),
    ],
)
def test_public_size_old_files_convert_completely(hub_id, stock_class):
    """On the meta device, with the unused cross-attention bias that old files store."""
    fields = ARCH.public[hub_id]
    stock = public_stock_model(ARCH, fields, stock_class)
    shapes = shapes_on_disk(stock)
    bias = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
    if stock_class != "T5EncoderModel":
        shapes[bias] = (32, fields["num_heads"])
    meta = plan_on_meta(ARCH, stock, shapes)

    assert meta.accounted == set(shapes)
    assert meta.plan.dropped == ([] if stock_class == "T5EncoderModel" else [bias])
    assert set(meta.expected) == set(meta.produced)
    assert all(meta.produced[key] == meta.expected[key] for key in meta.expected)
    assert meta.parameters == stock_parameters(stock)  # really the public size
    if stock_class == "T5ForConditionalGeneration":  # v1.1 (FLAN) keeps its own head, without output scaling
        own_head = fields.get("tie_word_embeddings") is False
        assert meta.config.scale_decoder_outputs != own_head
        assert meta.produced["lm_head.weight"] == (fields["vocab_size"], fields["d_model"])
    with torch.device("meta"):
        ours = ARCH.class_named(stock_class)(meta.config)
    assert len(ours.encoder.layers) == fields["num_layers"]
    assert ours.config.get_text_config(decoder=True).num_hidden_layers == meta.config.num_decoder_layers


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    config = FivefoldT5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=3, num_heads=4,
        dropout_rate=0.0, decoder_start_token_id=0,
    )  # fmt: skip
    model = FivefoldT5ForConditionalGeneration(config).train()
    batch = {
        "input_ids": torch.randint(2, 99, (2, 9)),
        "attention_mask": torch.tensor([[1] * 9, [1] * 6 + [0] * 3]),
        "labels": torch.randint(2, 99, (2, 5)),
    }

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad()
        model(**batch).loss.backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    checkpointed = grads()
    assert set(plain) == set(checkpointed) and "encoder.layers.0.attn.q_proj.weight" in plain
    assert all(torch.allclose(plain[k], checkpointed[k], atol=1e-6) for k in plain)


PIPELINE_WITHOUT_FIVEFOLD = NO_FIVEFOLD + textwrap.dedent(
    """
    import json, transformers
    folder, prompt = sys.argv[1:3]
    generator = transformers.pipeline("text-generation", model=folder, trust_remote_code=True)
    assert "fivefold" not in sys.modules
    print(json.dumps([type(generator.model).__name__, generator(prompt, max_new_tokens=6, do_sample=False)]))
    """
)


@pytest.mark.slow
def test_text_generation_pipeline_takes_the_conditional_generation_class_as_stock(tmp_path):
    """Stock's "text-generation" pipeline finds no causal LM for T5 and falls back on the class its config names;
    a fivefold folder (fivefold installed, or only stock transformers and its shipped code) does the same."""
    # Equal depths, as public T5s have: stock's pipeline sizes its cache by the encoder's depth.
    stock_fields = dict(vocab_size=30522, num_decoder_layers=2)
    src = build_stock_checkpoint("t5", "T5ForConditionalGeneration", tmp_path / "stock", **stock_fields)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_folder() / name, src / name)  # an uncased WordPiece tokenizer of 30,522 tokens
    dst = fivefold.convert(src, tmp_path / "fivefold", progress=False)
    prompt, settings = "the relative bias of the decoder", dict(max_new_tokens=6, do_sample=False)
    expected = transformers.pipeline("text-generation", model=str(src))(prompt, **settings)
    ours = transformers.pipeline("text-generation", model=str(dst))
    assert type(ours.model) is FivefoldT5ForConditionalGeneration
    assert ours(prompt, **settings) == expected
    (tmp_path / "remote.py").write_text(PIPELINE_WITHOUT_FIVEFOLD)
    run = subprocess.run(
        [sys.executable, str(tmp_path / "remote.py"), str(dst), prompt],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.splitlines()[-1]) == ["FivefoldT5ForConditionalGeneration", expected]


@pytest.mark.parametrize("stock_class", ["T5Model", "T5ForConditionalGeneration", "T5EncoderModel"])
def test_dummy_inputs_run_as_stocks(stock_class, tmp_path):
    src = build_stock_checkpoint("t5", stock_class, tmp_path / "stock")
    stock = getattr(transformers, stock_class).from_pretrained(src).eval()
    ours = ARCH.class_named(stock_class).from_pretrained(fivefold.convert(src, tmp_path / "ff", progress=False)).eval()
    listed = [{k: v.tolist() for k, v in model.dummy_inputs.items()} for model in (ours, stock)]
    assert listed[0] == listed[1]
    with torch.no_grad():
        torch.testing.assert_close(ours(**ours.dummy_inputs)[0], stock(**stock.dummy_inputs)[0], atol=TOL, rtol=0)
