"""The model card of a conversion: Hub metadata read back by huggingface_hub's own parser, no local path in it, the
source card's license/language/datasets carried, and no source string able to add a field."""

import shutil

import pytest
from huggingface_hub import ModelCard

import fivefold
from fivefold.architectures import ARCHITECTURES
from fivefold.conversion.model_card import pipeline_tag


def card_of(folder) -> ModelCard:
    return ModelCard((folder / "README.md").read_text(encoding="utf-8"))


def test_local_source_has_no_base_model_and_no_path(converted):
    src, dst = converted("bert", "BertForMaskedLM")
    card = card_of(dst)
    data = card.data.to_dict()
    assert set(data.pop("fivefold")) == {"version", "sha256"}  # the integrity record (test_integrity.py)
    assert data == {
        "library_name": "transformers",
        "tags": ["fivefold", "bert"],
        "pipeline_tag": "fill-mask",
    }
    assert str(src) not in card.content and str(src.parent) not in card.content
    assert card.text.lstrip().startswith(f"# {src.name} for fivefold")
    assert 'from_pretrained("path/to/this/folder", trust_remote_code=True)' in card.text
    assert "import fivefold" in card.text


def test_no_source_string_adds_a_field(stock_checkpoint, tmp_path):
    src = tmp_path / "evil\nbase_model: injected\nlicense: leaked"
    shutil.copytree(stock_checkpoint("bert", "BertForMaskedLM"), src)
    (src / "README.md").write_text(
        "---\nlicense: 'mit\n\n  pipeline_tag: injected'\nlanguage: [en, fr]\ndatasets: {not: a list}\n"
        "base_model: /home/someone/model\n---\n# a card\n",
        encoding="utf-8",
    )
    card = card_of(fivefold.convert(src, tmp_path / "out", progress=False))
    data = card.data.to_dict()
    assert set(data) == {"library_name", "tags", "pipeline_tag", "license", "language", "fivefold"}
    assert data["license"] == "mit\npipeline_tag: injected" and data["pipeline_tag"] == "fill-mask"
    assert data["language"] == ["en", "fr"]  # carried; datasets (not a list of names) and base_model are not
    assert "/home/someone" not in card.content
    title = card.text.lstrip().splitlines()[0]
    assert title == "# evil base_model: injected license: leaked for fivefold"


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.stock_model_type)
def test_pipeline_tag_from_the_head(arch):
    tags = {cls.__name__.removeprefix("Fivefold"): pipeline_tag(arch, cls) for cls in arch.models.values()}
    expected = {
        "BertForMaskedLM": "fill-mask",
        "BertForSequenceClassification": "text-classification",
        "BertForQuestionAnswering": "question-answering",
        "BertModel": "feature-extraction",
        "GPT2LMHeadModel": "text-generation",
        "T5ForConditionalGeneration": "text2text-generation",
        "ViTModel": "image-feature-extraction",
        "ViTForImageClassification": "image-classification",
        "MixtralForCausalLM": "text-generation",
    }
    for name, tag in tags.items():
        if name in expected:
            assert tag == expected[name], name
