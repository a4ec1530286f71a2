"""ViT against stock transformers on the same tiny random weights (32 x 32 images, 8 x 8 patches), at the native
size and at interpolated ones; dropout placement, gradients; the errors for bad inputs, bad configs and bad
checkpoints; stock folders loading directly; the image processor travelling with the weights so that
pipeline("image-classification") gives stock's labels; the names of the public files. (Classification losses:
test_parity.py; the round trip: test_roundtrip.py; the shipped code: test_remote_code.py; fine-tuning:
test_trainer.py.)"""

import shutil

import numpy as np
import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file, save_file

import fivefold
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.inputs import image_inputs
from fivefold.conversion.samples import build_stock_checkpoint
from fivefold.conversion.verify import compare

from helpers import plan_on_meta, public_stock_model, shapes_on_disk

ARCH = architecture_for_model_type("vit")
TOL = 1e-4
LABELS = ["cat", "dog", "bird", "fish", "frog"]

CLASSES = {
    "ViTModel": fivefold.FivefoldViTModel,
    "ViTForImageClassification": fivefold.FivefoldViTForImageClassification,
}


def _pair(converted, stock_name, attn="sdpa", **kwargs):
    src, dst = converted("vit", stock_name)
    stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=attn, **kwargs).eval()
    ours = CLASSES[stock_name].from_pretrained(dst, attn_implementation=attn, **kwargs).eval()
    return stock, ours


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("stock_name", list(CLASSES))
@pytest.mark.parametrize("size", [(32, 32), (48, 48), (64, 40), (24, 32), (35, 35)])
def test_matches_stock_at_native_and_interpolated_sizes(converted, stock_name, attn, size):
    stock, ours = _pair(converted, stock_name, attn)
    inputs = {**image_inputs(stock.config, size=size), "interpolate_pos_encoding": size != (32, 32)}
    diffs = compare(stock, ours, inputs)
    assert len([k for k in diffs if k.startswith("hidden_states[")]) == stock.config.num_hidden_layers + 1
    assert max(diffs.values()) <= TOL, diffs


def test_interpolation_changes_the_positions(converted):
    """A larger image gets a resized grid (not the first rows of the table): 6 x 6 patches, 37 tokens."""
    _, ours = _pair(converted, "ViTModel")
    positions = ours.embeddings.positions_for(48, 48)
    assert positions.shape == (1, 37, 32)
    assert torch.equal(positions[:, 0], ours.embeddings.position_embeddings[:, 0])  # [CLS] keeps its position
    assert not torch.allclose(positions[:, 1:17], ours.embeddings.position_embeddings[:, 1:])


def test_output_fields_attentions_and_tuples_match_stock(converted):
    stock, ours = _pair(converted, "ViTModel", "eager")
    inputs = image_inputs(stock.config)
    with torch.no_grad():
        expected = stock(**inputs, output_attentions=True, output_hidden_states=True)
        got = ours(**inputs, output_attentions=True, output_hidden_states=True)
    assert set(expected.keys()) == set(got.keys())
    assert type(got).__name__ == "BaseModelOutputWithPooling"
    for a, b in zip(expected.attentions, got.attentions, strict=True):
        assert a.shape == (3, 4, 17, 17) and (a - b).abs().max() <= TOL
    # hidden_states[-1] is the last block's output before the final norm, as in stock
    assert not torch.allclose(got.hidden_states[-1], got.last_hidden_state)
    assert torch.allclose(ours(**inputs, return_dict=False)[0], got.last_hidden_state)


def test_training_mode_dropout_matches_stock(converted):
    """Same seed, same dropout masks: equal only if every dropout sits where stock puts it."""
    kwargs = dict(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3)
    stock, ours = _pair(converted, "ViTForImageClassification", "eager", **kwargs)
    stock.train(), ours.train()
    inputs = image_inputs(stock.config, size=(40, 40))
    torch.manual_seed(123)
    expected = stock(**inputs, interpolate_pos_encoding=True).logits
    torch.manual_seed(123)
    got = ours(**inputs, interpolate_pos_encoding=True).logits
    torch.manual_seed(124)
    other = ours(**inputs, interpolate_pos_encoding=True).logits
    assert (expected - got).abs().max() <= TOL
    assert (expected - other).abs().max() > TOL  # dropout is really on


def test_gradients_flow_with_checkpointing_and_low_precision(converted):
    _, ours = _pair(converted, "ViTForImageClassification")
    ours.activation_checkpointing_enable()
    ours.train()
    out = ours(**image_inputs(ours.config), labels=torch.tensor([0, 1, 0]))
    out.loss.backward()
    assert ours.model.embeddings.cls_token.grad is not None and ours.model.layers[0].attn.q_proj.weight.grad is not None
    half = ours.eval().to(torch.bfloat16)
    assert half(**image_inputs(ours.config)).logits.dtype == torch.bfloat16  # fp32 pixels are cast, as in stock


@pytest.fixture(scope="module")
def vit(converted):
    return transformers.AutoModel.from_pretrained(converted("vit", "ViTModel")[1]).eval()


def test_wrong_image_size_names_both_sizes(vit):
    with pytest.raises(ValueError, match=r"\(48\*40\).*\(32\*32\).*interpolate_pos_encoding=True"):
        vit(**image_inputs(vit.config, size=(48, 40)))


def test_masked_patches_are_refused_not_ignored(vit):
    """Stock's masked-image modelling (`bool_masked_pos`) needs a mask token that fivefold's ViT does not have."""
    with pytest.raises(ValueError, match="bool_masked_pos needs a mask token"):
        vit(**image_inputs(vit.config), bool_masked_pos=torch.zeros(2, 4, dtype=torch.bool))


def test_wrong_channel_count(vit):
    with pytest.raises(ValueError, match="1 channels, the model expects 3"):
        vit(pixel_values=torch.randn(2, 1, 32, 32))


@pytest.mark.parametrize(
    ("pixel_values", "message"),
    [
        (None, "pass pixel_values"),
        (torch.randn(3, 32, 32), r"\[batch, channels, height, width\], got shape \(3, 32, 32\)"),
        (torch.randn(1, 3, 4, 32), r"smaller than one patch \(8\*8\)"),
    ],
)
def test_malformed_pixel_values(vit, pixel_values, message):
    with pytest.raises(ValueError, match=message):
        vit(pixel_values=pixel_values, interpolate_pos_encoding=True)


def test_mismatched_attention_mask(vit):
    with pytest.raises(ValueError, match="attention_mask has shape"):
        vit(**image_inputs(vit.config), attention_mask=torch.ones(3, 16))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(image_size=30, patch_size=8), r"patch_size \(8\) must divide image_size \(30\)"),
        (dict(image_size=[32, 36], patch_size=8), r"must divide image_size \(\[32, 36\]\)"),
        (dict(hidden_size=32, num_attention_heads=5), "num_attention_heads"),
        (dict(num_channels=0), "num_channels must be a positive integer"),
        (dict(image_size=[32, 32, 3]), "image_size must be an int or a"),
    ],
)
def test_config_rejects_inconsistent_fields(fields, message):
    with pytest.raises((StrictDataclassClassValidationError, ValueError), match=message):
        fivefold.FivefoldViTConfig(**fields)


def test_config_accepts_stock_fields_and_rectangular_images():
    stock = transformers.ViTConfig(hidden_size=64, num_attention_heads=8, pooler_act="relu").to_dict()
    ours = fivefold.FivefoldViTConfig.from_dict(stock)
    assert ours.model_type == "fivefold_vit" and ours.pooler_act == "relu"
    config = fivefold.FivefoldViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37, image_size=[32, 48],
        patch_size=[8, 16], pooler_output_size=7,
    )  # fmt: skip
    model = fivefold.FivefoldViTModel(config).eval()
    for learned in (model.embeddings.cls_token, model.embeddings.position_embeddings):  # initialised, not zeros
        assert 0.01 < float(learned.detach().std()) < 0.03
    out = model(pixel_values=torch.randn(2, 3, 32, 48))
    assert out.last_hidden_state.shape == (2, 1 + 4 * 3, 32) and out.pooler_output.shape == (2, 7)
    wider = model(pixel_values=torch.randn(1, 3, 64, 48), interpolate_pos_encoding=True)
    assert wider.last_hidden_state.shape == (1, 1 + 8 * 3, 32)


# --- checkpoints --------------------------------------------------------------------------------------------


def test_stock_folder_loads_directly_and_saved_model_round_trips(converted, tmp_path):
    src, _ = converted("vit", "ViTForImageClassification")
    stock = transformers.ViTForImageClassification.from_pretrained(src).eval()
    ours = fivefold.FivefoldViTForImageClassification.from_pretrained(src).eval()  # converted in memory
    inputs = image_inputs(stock.config, size=(48, 40))
    with torch.no_grad():
        expected = stock(**inputs, interpolate_pos_encoding=True).logits
        assert (ours(**inputs, interpolate_pos_encoding=True).logits - expected).abs().max() <= 1e-4
    ours.save_pretrained(tmp_path / "saved")
    again = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        assert torch.equal(
            again(**inputs, interpolate_pos_encoding=True).logits, ours(**inputs, interpolate_pos_encoding=True).logits
        )
    # a base-model checkpoint (with its pooler) starts a classifier: the pooler is ignored quietly
    base_src, _ = converted("vit", "ViTModel")
    classifier = fivefold.FivefoldViTForImageClassification.from_pretrained(base_src, num_labels=4)
    assert classifier.classifier.out_features == 4


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """A tiny stock classifier with named labels and a saved ViTImageProcessor, and its conversion."""
    folder = tmp_path_factory.mktemp("vit-labelled")
    src = build_stock_checkpoint(
        "vit", "ViTForImageClassification", folder / "stock", num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)), label2id={name: i for i, name in enumerate(LABELS)},
    )  # fmt: skip
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(src)
    return src, fivefold.convert(src, folder / "fivefold", progress=False)


def test_pipeline_gives_stock_labels(labelled):
    from PIL import Image

    src, dst = labelled
    assert (dst / "preprocessor_config.json").read_text() == (src / "preprocessor_config.json").read_text()
    processor = transformers.AutoImageProcessor.from_pretrained(dst)
    assert processor.size == {"height": 32, "width": 32}
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (28 + 9 * i, 45, 3), dtype=np.uint8)) for i in range(6)]
    stock = transformers.pipeline("image-classification", model=str(src))
    ours = transformers.pipeline("image-classification", model=str(dst))
    assert type(ours.model).__name__ == "FivefoldViTForImageClassification"
    expected, got = stock(images, top_k=3), ours(images, top_k=3)
    assert [[p["label"] for p in row] for row in got] == [[p["label"] for p in row] for row in expected]
    assert {row[0]["label"] for row in got} <= set(LABELS)
    for a, b in zip(expected, got, strict=True):
        assert max(abs(x["score"] - y["score"]) for x, y in zip(a, b, strict=True)) <= 1e-4


@pytest.mark.parametrize("stock_class", ["ViTForImageClassification", "ViTModel"])
def test_public_files_keep_the_stored_names(stock_class):
    """vit-base-patch16-224 on the meta device: its files hold the Hub names, which transformers 5 renames in memory
    and back on saving; fivefold reads those. (The complete conversion at the public size: test_meta.py.)"""
    stock = public_stock_model(ARCH, ARCH.public["google/vit-base-patch16-224"], stock_class)
    shapes = shapes_on_disk(stock)
    prefix = "" if stock_class == "ViTModel" else "vit."
    assert f"{prefix}encoder.layer.11.attention.attention.query.weight" in shapes
    assert shapes[f"{prefix}embeddings.position_embeddings"] == (1, 197, 768)
    meta = plan_on_meta(ARCH, stock, shapes)
    assert meta.accounted == set(shapes) and not meta.plan.dropped
    assert meta.produced == meta.expected


def test_bad_vit_checkpoints_name_the_tensor(stock_checkpoint, tmp_path):
    """A position table for another image size, a missing query, a mask token for a head we do not have."""
    src = stock_checkpoint("vit", "ViTForImageClassification")
    cases = {
        "vit.embeddings.position_embeddings": (torch.zeros(1, 37, 32), ["[1, 37, 32]", "[1, 17, 32]"]),
        "vit.encoder.layer.1.attention.attention.query.weight": (None, ["missing"]),
        "vit.embeddings.mask_token": (torch.zeros(1, 1, 32), ["match no conversion rule"]),
    }
    for i, (key, (value, needles)) in enumerate(cases.items()):
        bad = tmp_path / f"bad{i}"
        shutil.copytree(src, bad)
        tensors = load_file(bad / "model.safetensors")
        if value is None:
            tensors.pop(key)
        else:
            tensors[key] = value
        save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(fivefold.ConversionError) as err:
            fivefold.convert(bad, tmp_path / f"out{i}", progress=False)
        assert key in str(err.value) and all(n in str(err.value) for n in needles), str(err.value)
        assert not (tmp_path / f"out{i}").exists()
