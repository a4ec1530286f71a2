"""ViT checkpoints: convert -> export is lossless, stock folders load directly, the image processor travels with
the weights so that pipeline("image-classification") gives stock's labels, the shipped code loads without
fivefold, and vit-base-patch16-224 converts completely on the meta device."""

import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from test_remote_code import _remote_logits

import fivefold
from fivefold.architectures import architecture_for_model_type
from fivefold.conversion.inputs import image_inputs
from fivefold.conversion.samples import build_stock_checkpoint
from fivefold.conversion.source import build_config
from fivefold.conversion.validation import check_plan, expected_tensors, our_prefix

LABELS = ["cat", "dog", "bird", "fish", "frog"]


def _tensors(folder):
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


@pytest.mark.parametrize("stock_name", ["ViTModel", "ViTForImageClassification"])
def test_export_restores_stock_checkpoint(converted, tmp_path, stock_name):
    src, dst = converted("vit", stock_name)
    ours = _tensors(dst)
    assert "model.embeddings.patch_proj.weight" in ours or "embeddings.patch_proj.weight" in ours
    out = fivefold.export(dst, tmp_path / "stock-again", progress=False)
    original, exported = _tensors(src), _tensors(out)
    assert set(original) == set(exported)
    assert all(torch.equal(original[k], exported[k]) for k in original)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "vit" and config["architectures"] == [stock_name]
    stock = getattr(transformers, stock_name).from_pretrained(src).eval()
    again = getattr(transformers, stock_name).from_pretrained(out).eval()
    inputs = image_inputs(stock.config)
    with torch.no_grad():
        assert torch.equal(stock(**inputs)[0], again(**inputs)[0])


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


def test_converted_folder_loads_as_remote_code(labelled, tmp_path):
    src, dst = labelled
    config = json.loads((dst / "config.json").read_text())
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForImageClassification"}
    stock = transformers.ViTForImageClassification.from_pretrained(src).eval()
    inputs = image_inputs(stock.config)
    remote = _remote_logits(tmp_path, dst, "AutoModelForImageClassification", inputs)
    assert remote["cls"] == "FivefoldViTForImageClassification" and remote["module"].startswith("transformers_modules.")
    with torch.no_grad():
        assert (remote["logits"] - stock(**inputs).logits).abs().max() <= 1e-4


# google/vit-base-patch16-224's config.json (fields that matter for shapes).
VIT_BASE_PATCH16_224 = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, image_size=224,
    patch_size=16, num_channels=3, qkv_bias=True, layer_norm_eps=1e-12, num_labels=1000,
)  # fmt: skip


@pytest.mark.parametrize("stock_class", ["ViTForImageClassification", "ViTModel"])
def test_public_size_conversion_is_complete(stock_class):
    arch = architecture_for_model_type("vit")
    stock_config = transformers.ViTConfig(**VIT_BASE_PATCH16_224)
    with torch.device("meta"):
        stock = getattr(transformers, stock_class)(stock_config)
    # The files hold the Hub names, which transformers 5 renames in memory: save the way save_pretrained does.
    from transformers.core_model_loading import revert_weight_conversion

    on_disk = revert_weight_conversion(stock, stock.state_dict())
    shapes = {k: tuple(v.shape) for k, v in on_disk.items()}
    prefix = "" if stock_class == "ViTModel" else "vit."
    assert f"{prefix}encoder.layer.11.attention.attention.query.weight" in shapes
    assert shapes[f"{prefix}embeddings.position_embeddings"] == (1, 197, 768)
    target = arch.class_named(stock_class)
    config = build_config(arch, {**stock_config.to_dict(), "architectures": [stock_class]}, target, None)
    plan = arch.keys(config).plan(shapes, arch.stock_prefix, our_prefix(arch, target))
    produced, _ = check_plan(arch, target, config, plan, shapes, strict=True)
    expected, _ = expected_tensors(target, config)
    accounted = {s for step in plan.steps for s in step.sources} | set(plan.dropped)
    assert accounted == set(shapes) and not plan.dropped
    assert produced == expected
    params = sum(torch.Size(s).numel() for s in expected.values())
    assert params > 85_000_000  # really the public size (86.6M with the 1000-class head)


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
