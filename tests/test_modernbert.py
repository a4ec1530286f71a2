"""ModernBERT against stock on the same weights: every head, padded and unpadded, rows longer than the sliding
window (fp32, 1e-4); config forms; losses; the fused projections; the public config's layer pattern. (The round
trip: test_roundtrip.py; conversion at the public size: test_meta.py.)"""

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file

import fivefold
from fivefold.architectures import architecture_for_model_type, stock_class_name
from fivefold.conversion.samples import build_stock_checkpoint
from fivefold.conversion.verify import compare

from helpers import plan_on_meta, public_stock_model, shapes_on_disk

ARCH = architecture_for_model_type("modernbert")
HEADS = [stock_class_name(cls) for cls in ARCH.models.values()]
TOL = 1e-4
# Every bias and the other pooling switched on, in the v5 config form.
VARIANT = dict(
    classifier_pooling="mean", norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True,
    decoder_bias=False, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}},
    local_attention=6,
)  # fmt: skip


VARIANTS = {"legacy-config": {}, "v5-config-biases-mean": VARIANT}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(stock folder, fivefold folder) of a tiny ModernBERT checkpoint per head and config variant."""
    cache = {}

    def make(stock_name: str, variant: str = "legacy-config"):
        if (stock_name, variant) not in cache:
            folder = tmp_path_factory.mktemp(f"{stock_name}-{variant}")
            src = build_stock_checkpoint("modernbert", stock_name, folder / "stock", **VARIANTS[variant])
            cache[stock_name, variant] = (src, fivefold.convert(src, folder / "fivefold", progress=False))
        return cache[stock_name, variant]

    return make


def _pair(converted, stock_name, attn, unpad, variant="legacy-config"):
    src, dst = converted(stock_name, variant)
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=attn).eval()
    ours = ARCH.class_named(stock_name).from_pretrained(dst, attn_implementation=attn, unpad_inputs=unpad).eval()
    return stock, ours


def _hidden(model, inputs):
    with torch.no_grad():
        return model.base_model(**inputs).last_hidden_state


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("attn", "unpad"), [("eager", False), ("sdpa", False), ("sdpa", True)])
@pytest.mark.parametrize("stock_name", HEADS)
def test_head_matches_stock(converted, stock_name, attn, unpad, variant):
    stock, ours = _pair(converted, stock_name, attn, unpad, variant)
    inputs = ARCH.sample_inputs(stock.config, stock_name)
    mask = inputs["attention_mask"]
    assert mask.min() == 0 and int(mask.sum(-1).max()) > stock.config.local_attention  # ragged, beyond the window
    diffs = compare(stock, ours, inputs)
    assert sum(k.startswith("hidden_states[") for k in diffs) == stock.config.num_hidden_layers + 1
    assert max(diffs.values()) <= TOL, diffs
    # Unpadded execution leaves padded positions at zero; the padded layout computes them.
    pads = _hidden(ours, {k: v.reshape(-1, v.shape[-1]) for k, v in inputs.items()})[
        mask.reshape(-1, mask.shape[-1]) == 0
    ]
    assert bool((pads == 0).all()) == unpad


def test_fewer_layers_at_load_as_stock_builds_them(converted):
    """`num_hidden_layers=n` at load keeps the first n layers (stock's recipe for a shallower model), though
    layer_types still lists every layer."""
    src, dst = converted("ModernBertForMaskedLM")
    stock = transformers.ModernBertForMaskedLM.from_pretrained(src, num_hidden_layers=1).eval()
    ours = ARCH.class_named("ModernBertForMaskedLM").from_pretrained(dst, num_hidden_layers=1).eval()
    assert len(ours.model.layers) == len(stock.model.layers) == 1
    inputs = ARCH.sample_inputs(stock.config, "ModernBertForMaskedLM", 0)
    inputs.pop("labels", None)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        assert (stock(**inputs).logits - ours(**inputs).logits)[real].abs().max() <= TOL


def test_long_rows_left_padding_and_inputs_embeds(converted):
    """Rows much longer than the window, left padded (stock numbers positions over the padded row)."""
    stock, ours = _pair(converted, "ModernBertModel", "sdpa", True)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([40, 1, 23, 37])
    ids = torch.randint(3, 99, (4, 40), generator=gen)
    mask = (torch.arange(40)[None] >= 40 - lengths[:, None]).long()
    embeds = stock.get_input_embeddings()(ids)
    for inputs in ({"input_ids": ids, "attention_mask": mask}, {"inputs_embeds": embeds, "attention_mask": mask}):
        a, b = _hidden(stock, inputs), _hidden(ours, inputs)
        assert (a - b)[mask.bool()].abs().max() <= TOL


def test_config_forms_agree():
    legacy = fivefold.FivefoldModernBertConfig(
        num_hidden_layers=4,
        global_attn_every_n_layers=2,
        local_attention=8,
        global_rope_theta=1e3,
        local_rope_theta=7.0,
    )
    assert legacy.layer_types == ["full_attention", "sliding_attention"] * 2
    assert legacy.rope_parameters["sliding_attention"]["rope_theta"] == 7.0
    v5 = fivefold.FivefoldModernBertConfig(
        num_hidden_layers=4, layer_types=legacy.layer_types, rope_parameters=legacy.rope_parameters, local_attention=8
    )
    reloaded = fivefold.FivefoldModernBertConfig.from_dict(legacy.to_dict())
    for config in (v5, reloaded):
        assert config.layer_types == legacy.layer_types and config.rope_parameters == legacy.rope_parameters
    attention = [block.attention for block in ARCH.base_model.recipe(legacy).stack.blocks]
    assert tuple(a.window for a in attention) == (None, 4, None, 4)  # local_attention is the whole window
    assert tuple(a.rotary_theta for a in attention) == (1e3, 7.0, 1e3, 7.0)
    with pytest.raises(StrictDataclassClassValidationError, match="layer_types"):
        fivefold.FivefoldModernBertConfig(num_hidden_layers=2, layer_types=["full_attention", "global"])
    with pytest.raises(StrictDataclassClassValidationError, match="rope_type"):
        fivefold.FivefoldModernBertConfig(
            num_hidden_layers=1,
            layer_types=["full_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1.0, "factor": 2.0}},
        )


@pytest.mark.parametrize("unpad", [False, True])
def test_losses_match_stock(converted, unpad):
    def labels_on_tokens(x):
        return x["input_ids"].masked_fill(x["attention_mask"] == 0, -100)

    cases = {
        "ModernBertForMaskedLM": lambda x: {"labels": labels_on_tokens(x)},
        "ModernBertForSequenceClassification": lambda x: {"labels": torch.tensor([0, 1, 1])},
        "ModernBertForTokenClassification": lambda x: {
            "labels": labels_on_tokens(x).remainder(2).masked_fill(x["attention_mask"] == 0, -100)
        },
        "ModernBertForMultipleChoice": lambda x: {"labels": torch.tensor([1, 0, 1])},
    }
    if not unpad:  # the span softmax also covers padded positions, which unpadded execution leaves at zero
        cases["ModernBertForQuestionAnswering"] = lambda x: {
            "start_positions": torch.tensor([1, 2, 40]),
            "end_positions": torch.tensor([3, 2, 5]),
        }
    for stock_name, labels in cases.items():
        stock, ours = _pair(converted, stock_name, "sdpa", unpad)
        inputs = ARCH.sample_inputs(stock.config, stock_name)
        with torch.no_grad():
            a, b = stock(**inputs, **labels(inputs)), ours(**inputs, **labels(inputs))
        assert abs(a.loss - b.loss) <= TOL, stock_name


def test_sparse_prediction_matches_stock(converted):
    src, dst = converted("ModernBertForMaskedLM")
    stock = transformers.ModernBertForMaskedLM.from_pretrained(src, sparse_prediction=True).eval()
    ours = ARCH.class_named("ModernBertForMaskedLM").from_pretrained(dst, sparse_prediction=True).eval()
    inputs = ARCH.sample_inputs(stock.config, "ModernBertForMaskedLM")
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[:, 1:4] = inputs["input_ids"][:, 1:4]
    with torch.no_grad():
        a, b = stock(**inputs, labels=labels), ours(**inputs, labels=labels)
    assert b.logits.shape == a.logits.shape == (9, stock.config.vocab_size)
    assert (a.logits - b.logits).abs().max() <= TOL and abs(a.loss - b.loss) <= TOL


def test_fused_projections_split_as_stock_uses_them(converted):
    """Wqkv = [query; key; value]; Wi = [input; gate] with act(input) * gate, so input is our gate_proj."""
    src, dst = converted("ModernBertModel")
    stock = load_file(next(src.glob("*.safetensors")))
    ours = ARCH.base_model.from_pretrained(dst)
    wi = stock["layers.1.mlp.Wi.weight"]
    assert torch.equal(ours.layers[1].mlp.gate_proj.weight, wi[: wi.shape[0] // 2])
    wqkv = stock["layers.1.attn.Wqkv.weight"]
    assert torch.equal(ours.layers[1].attn.k_proj.weight, wqkv.chunk(3)[1])
    assert isinstance(ours.layers[0].norm_before_attn, torch.nn.Identity)  # as stock's first layer


def test_public_config_alternates_global_and_local_layers():
    """ModernBERT-base's config.json (the legacy form) as fivefold reads it: every third layer global, a window of
    64 positions each side. (Its conversion at the public size: test_meta.py.)"""
    stock = public_stock_model(ARCH, ARCH.public["answerdotai/ModernBERT-base"], "ModernBertModel")
    config = plan_on_meta(ARCH, stock, shapes_on_disk(stock)).config
    assert config.layer_types.count("full_attention") == 8 and config.sliding_window == 64
