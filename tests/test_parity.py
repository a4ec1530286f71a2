"""Every head of every architecture in the table against its stock class on the same weights, on the architecture's
sample inputs (text: a ragged padded batch; images: a batch at the native size), fp32, logits and all hidden
states within 1e-4; the losses of every sequence or image classifier for each problem type; config fields that
stock's config class does not declare, which stock ignores; the batch columns each forward names; token types a
model has not; the class, fields and tuple order of every output; and the rope as the Hub's checkpoints spell it
(`rope_scaling`), converted, loaded directly and verified. What only one architecture has is tested in its own
file (test_bert_family.py, test_gpt2.py, ...)."""

import inspect
import json
import shutil

import pytest
import torch
import transformers

import fivefold
from fivefold.architectures import ARCHITECTURES, architecture_for_model_type, stock_class_name
from fivefold.conversion.verify import compare

from helpers import stock_attention

HEADS = [
    pytest.param(arch, stock_class_name(cls), id=cls.__name__) for arch in ARCHITECTURES for cls in arch.models.values()
]
TOL = 1e-4


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize(("arch", "stock_name"), HEADS)
def test_head_matches_stock(converted, arch, stock_name, attn):
    src, dst = converted(arch.stock_model_type, stock_name)
    stock_attn = stock_attention(stock_name, attn)
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=stock_attn).eval()
    ours = arch.class_named(stock_name).from_pretrained(dst, attn_implementation=attn).eval()
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    assert "attention_mask" not in inputs or inputs["attention_mask"].min() == 0  # text: padded and ragged
    diffs = compare(stock, ours, inputs)
    assert any("hidden_states[" in k for k in diffs)
    assert max(diffs.values()) <= TOL, diffs


CLASSIFIERS = [
    pytest.param(arch, stock_class_name(cls), id=cls.__name__)
    for arch in ARCHITECTURES
    for auto_name, cls in arch.models.items()
    if auto_name in ("AutoModelForSequenceClassification", "AutoModelForImageClassification")
]


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "labels"),
    [
        ("single_label_classification", 3, torch.tensor([0, 2, 1])),
        ("regression", 1, torch.tensor([0.5, -1.0, 2.0])),
        ("multi_label_classification", 3, torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 0]])),
        (None, 3, torch.tensor([2, 0, 1])),  # inferred from the labels, as stock does
    ],
)
@pytest.mark.parametrize(("arch", "stock_name"), CLASSIFIERS)
def test_classification_losses_match_stock(converted, arch, stock_name, problem_type, num_labels, labels):
    src, dst = converted(arch.stock_model_type, stock_name, num_labels=num_labels)
    stock = getattr(transformers, stock_name).from_pretrained(src, problem_type=problem_type).eval()
    ours = arch.class_named(stock_name).from_pretrained(dst, problem_type=problem_type).eval()
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    with torch.no_grad():
        a, b = stock(**inputs, labels=labels), ours(**inputs, labels=labels)
    assert type(b).__name__ == type(a).__name__
    assert (a.logits - b.logits).abs().max() <= TOL
    assert abs(a.loss - b.loss) <= TOL
    assert ours.config.problem_type == stock.config.problem_type


# Fields a config.json may carry that the architecture's stock config class does not declare (a Llama converted
# from a Mistral keeps its `sliding_window`): stock's model never reads them, and fivefold's must not either.
UNDECLARED = [
    ("llama", "LlamaForCausalLM", {"sliding_window": 3}),
    ("olmoe", "OlmoeForCausalLM", {"sliding_window": 3}),
    (
        "mistral",
        "MistralForCausalLM",
        {"attention_bias": True, "mlp_bias": True, "layer_types": ("full_attention",) * 2},
    ),
    ("mixtral", "MixtralForCausalLM", {"attention_bias": True}),
    ("qwen2", "Qwen2ForCausalLM", {"mlp_bias": True}),
]


@pytest.mark.parametrize(("model_type", "stock_name", "fields"), UNDECLARED, ids=lambda v: str(v)[:40])
def test_fields_the_stock_config_does_not_declare_are_ignored(converted, model_type, stock_name, fields):
    src, dst = converted(model_type, stock_name, **fields)
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    kept = {name: getattr(stock.config, name) for name in fields}  # kept as attributes, never read
    assert kept == {name: list(v) if isinstance(v, tuple) else v for name, v in fields.items()}
    arch = architecture_for_model_type(model_type)
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    assert inputs["input_ids"].shape[1] > 3  # past the stray window
    for folder in (dst, src):
        ours = arch.class_named(stock_name).from_pretrained(folder).eval()
        assert max(compare(stock, ours, inputs).values()) <= TOL


# What a tokenizer, an image processor or a data collator puts in a batch: Trainer keeps a dataset's column only
# where the model's forward names it (`remove_unused_columns`), so fivefold's heads name every one stock's do.
BATCH_COLUMNS = {
    "input_ids", "attention_mask", "token_type_ids", "position_ids", "pixel_values", "labels", "decoder_input_ids",
    "decoder_attention_mask", "start_positions", "end_positions", "next_sentence_label",
}  # fmt: skip


@pytest.mark.parametrize(("arch", "stock_name"), HEADS)
def test_forward_names_every_batch_column_stocks_does(arch, stock_name):
    def named(cls) -> set[str]:
        return set(inspect.signature(cls.forward).parameters) & BATCH_COLUMNS

    assert named(getattr(transformers, stock_name)) <= named(arch.class_named(stock_name))


# The base model of each architecture without a token-type table (BERT's and RoBERTa's have one, GPT-2 reads token
# types from its word table, ViT reads pixels, T5's forward does not take them).
WITHOUT_TOKEN_TYPES = [
    pytest.param(arch, stock_class_name(next(iter(arch.models.values()))), id=arch.stock_model_type)
    for arch in ARCHITECTURES
    if arch.stock_model_type not in ("bert", "roberta", "vit", "gpt2", "t5")
]


@pytest.mark.parametrize(("arch", "stock_name"), WITHOUT_TOKEN_TYPES)
def test_token_types_a_model_has_not_are_ignored_as_by_stock(converted, arch, stock_name):
    """A batch column of token types (a pair tokenized by a tokenizer that marks segments, which Trainer hands
    over where the forward names it) changes nothing, as for stock, where it used to be refused."""
    src, dst = converted(arch.stock_model_type, stock_name)
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    ours = arch.class_named(stock_name).from_pretrained(dst).eval()
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    with_types = {**inputs, "token_type_ids": torch.ones_like(inputs["input_ids"])}
    assert max(compare(stock, ours, with_types).values()) <= TOL
    with torch.no_grad():
        assert torch.equal(ours(**with_types).last_hidden_state, ours(**inputs).last_hidden_state)


@pytest.mark.parametrize(("arch", "stock_name"), HEADS)
def test_outputs_have_stocks_class_fields_and_tuple_order(converted, arch, stock_name):
    """What code reads off an output besides the numbers: its class (`isinstance`), its fields (`cross_attentions`
    on GPT-2, an empty tuple), and the order of `return_dict=False`'s tuple (MoE router logits second)."""
    src, dst = converted(arch.stock_model_type, stock_name)
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation="eager").eval()
    ours = arch.class_named(stock_name).from_pretrained(dst, attn_implementation="eager").eval()
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    asked = dict(output_attentions=True, output_hidden_states=True)
    if hasattr(stock.config, "output_router_logits"):  # a mixture of experts
        asked["output_router_logits"] = True
    with torch.no_grad():
        want, got = stock(**inputs, **asked), ours(**inputs, **asked)
        want_tuple, got_tuple = stock(**inputs, **asked, return_dict=False), ours(**inputs, **asked, return_dict=False)
    assert type(got).__name__ == type(want).__name__
    assert list(got.keys()) == list(want.keys())
    assert len(got_tuple) == len(want_tuple)
    for w, g in zip(want_tuple, got_tuple, strict=True):
        assert type(g) is type(w)
        if isinstance(w, torch.Tensor):
            assert g.shape == w.shape
        elif isinstance(w, tuple):
            assert len(g) == len(w)


@pytest.mark.parametrize(("arch", "stock_name"), HEADS)
def test_the_base_model_answers_to_stocks_name(arch, stock_name):
    """`model.bert`, GPT-2's `model.transformer`, ...: what stock's class holds its base model under, the same
    module (freezing it freezes the same parameters), and nothing where stock has nothing."""
    stock_class, ours_class = getattr(transformers, stock_name), arch.class_named(stock_name)
    config = stock_class.config_class(**arch.tiny)
    stock, ours = stock_class(config), ours_class(arch.config_class(**arch.tiny))
    prefix = stock_class.base_model_prefix
    if not hasattr(stock, prefix):  # a base model, or T5's heads, which hold their stacks themselves
        assert not hasattr(ours, prefix) or prefix == ours.base_model_prefix
        return
    assert getattr(ours, prefix) is ours.base_model
    for model in (stock, ours):
        getattr(model, prefix).requires_grad_(False)
    trainable = [sum(p.numel() for p in m.parameters() if p.requires_grad) for m in (stock, ours)]
    assert trainable[0] == trainable[1]


# The rope as the Hub's checkpoints spell it: `rope_scaling` beside a top-level `rope_theta` (Llama 3.1 and 3.2,
# gpt-oss, Qwen2.5's yarn), which 5.x config classes read into `rope_parameters`. Shrunk: the sample inputs run
# past the original length.
LEGACY_ROPE = [
    ("llama", "LlamaForCausalLM", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 4}),
    ("gpt_oss", "GptOssForCausalLM", {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "truncate": False, "original_max_position_embeddings": 4}),
    ("qwen2", "Qwen2ForCausalLM", {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}),
]  # fmt: skip


@pytest.mark.parametrize(("model_type", "stock_name", "scaling"), LEGACY_ROPE, ids=[c[0] for c in LEGACY_ROPE])
def test_rope_scaling_as_the_hubs_checkpoints_spell_it(stock_checkpoint, tmp_path, model_type, stock_name, scaling):
    src = stock_checkpoint(model_type, stock_name)
    legacy = tmp_path / "stock"
    shutil.copytree(src, legacy)
    config = json.loads((legacy / "config.json").read_text())
    config.pop("rope_parameters", None)
    (legacy / "config.json").write_text(json.dumps({**config, "rope_theta": 10000.0, "rope_scaling": scaling}))
    dst = fivefold.convert(legacy, tmp_path / "fivefold", progress=False)
    attn = "eager" if model_type == "gpt_oss" else "sdpa"  # stock gpt-oss has no sdpa
    stock = getattr(transformers, stock_name).from_pretrained(legacy, attn_implementation=attn).eval()
    assert stock.config.rope_parameters["rope_type"] != "default"
    arch = architecture_for_model_type(model_type)
    inputs = arch.sample_inputs(stock.config, stock_name, 0)
    for folder in (dst, legacy):
        ours = arch.class_named(stock_name).from_pretrained(folder, attn_implementation=attn).eval()
        assert max(compare(stock, ours, inputs).values()) <= TOL
    assert max(fivefold.verify(legacy, dst).values()) <= TOL
