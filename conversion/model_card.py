"""The README.md of a converted folder: Hub metadata (YAML written by huggingface_hub, every value escaped), a title
naming the model, and how to load it with and without fivefold."""

import re
from pathlib import Path

from .remote_code import fivefold_version

# The Hub's pipeline tag of the task an Auto class loads (absent: no pipeline serves that head).
_PIPELINE_TAGS = {
    "AutoModel": "feature-extraction",
    "AutoModelForMaskedLM": "fill-mask",
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForQuestionAnswering": "question-answering",
    "AutoModelForCausalLM": "text-generation",
    "AutoModelForSeq2SeqLM": "text2text-generation",
    "AutoModelForTextEncoding": "feature-extraction",
    "AutoModelForImageClassification": "image-classification",
}
# Source card fields that describe the weights, so they stay true of the converted copy.
_CARRIED = ("license", "license_name", "license_link", "language", "datasets")
# Folder names that say nothing about the model (a package's `model/`, a Hub cache snapshot).
_GENERIC = re.compile(r"^(model|models|checkpoint|weights|snapshots?|out|output|[0-9a-f]{40})$", re.IGNORECASE)


def auto_class_of(arch, target: type) -> str:
    return next((auto for auto, cls in arch.models.items() if cls is target), "AutoModel")


def pipeline_tag(arch, target: type) -> str | None:
    auto = auto_class_of(arch, target)
    if auto == "AutoModel" and "AutoModelForImageClassification" in arch.models:
        return "image-feature-extraction"
    return _PIPELINE_TAGS.get(auto)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def display_name(src: str, hub_id: str | None) -> str:
    if hub_id is not None:
        return hub_id
    path = Path(src).resolve()
    names = [p.name for p in (path, *path.parents) if p.name]
    useful = [n for n in names if not _GENERIC.match(n)]
    return _one_line(useful[0] if useful else names[0] if names else src)


def _carried(source_folder: Path) -> dict:
    """license/language/datasets from the source's own card, only where they are plain strings or lists of them."""
    from huggingface_hub.repocard import metadata_load

    try:
        metadata = metadata_load(source_folder / "README.md") or {}
    except Exception:
        return {}  # a card whose front matter does not parse carries nothing
    if not isinstance(metadata, dict):
        return {}
    kept = {}
    for key in _CARRIED:
        value = metadata.get(key)
        if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
            kept[key] = value
    return kept


def _integrity_note(hashes: dict | None) -> str:
    if not hashes:
        return ""
    return (
        f"\nThe metadata above lists the sha256 of each of the {len(hashes)} files beside this card (weights, code,"
        "\nconfig); `fivefold verify --integrity FOLDER` checks a copy against them."
    )


def model_card(
    arch,
    target: type,
    src: str,
    source_folder: Path,
    *,
    hub_id: str | None,
    repo_id: str | None,
    sentence_transformers: bool = False,
    hashes: dict[str, str] | None = None,
) -> str:
    """The card of a conversion of `src` (`hub_id`: the Hub repo it came from, None for a local folder; `repo_id`:
    where it is pushed, for the usage snippet; `sentence_transformers`: the folder is a sentence-transformers
    model; `hashes`: the sha256 of each file beside the card, recorded with the fivefold version under the
    metadata's `fivefold` key for `fivefold verify --integrity`)."""
    from huggingface_hub import ModelCard, ModelCardData

    tags = ["fivefold", arch.stock_model_type, *(["sentence-transformers"] if sentence_transformers else [])]
    task = "sentence-similarity" if sentence_transformers else pipeline_tag(arch, target)
    data = ModelCardData(library_name="transformers", tags=tags, pipeline_tag=task)
    if hub_id is not None:
        data.base_model = hub_id
    for key, value in _carried(source_folder).items():
        setattr(data, key, value)
    if hashes is not None:
        data.fivefold = {"version": fivefold_version(), "sha256": dict(sorted(hashes.items()))}
    name, auto, where = display_name(src, hub_id), auto_class_of(arch, target), repo_id or "path/to/this/folder"
    origin = f"[{hub_id}](https://huggingface.co/{hub_id})" if hub_id is not None else f"`{name}`"
    body = f"""
# {name} for fivefold

{origin} ({target.__name__.removeprefix("Fivefold")}) converted with `fivefold convert` to fivefold's
`{arch.model_type}` layout ({target.__name__}). Tensors were renamed, not changed; `fivefold export` writes the
stock layout back.{_integrity_note(hashes)}

## Usage

With fivefold installed:

```python
import fivefold  # registers fivefold's model types with transformers
from transformers import {auto}

model = {auto}.from_pretrained("{where}")
```

With stock transformers only (the modeling code ships in this repo):

```python
from transformers import {auto}

model = {auto}.from_pretrained("{where}", trust_remote_code=True)
```
"""
    if sentence_transformers:
        body += f"""
With sentence-transformers (its modules travel with the weights):

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{where}", trust_remote_code=True)  # or `import fivefold` first, without the flag
```
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}").content
