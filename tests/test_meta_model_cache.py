"""The checks build each model class on the meta device once per config content, however often they ask about it,
and again when the config changes."""

import functools
from collections import Counter
from pathlib import Path

import pytest
import torch

from fivefold.architectures import architecture_for_model_type
from fivefold.conversion import validation
from fivefold.conversion.source import build_config

BERT = architecture_for_model_type("bert")
TARGET = BERT.models["AutoModelForMaskedLM"]


def _counting(cls: type, init, builds: Counter, inside: list):
    @functools.wraps(init)
    def __init__(self, config, *args, **kwargs):
        if not inside and torch.get_default_device().type == "meta":  # not the base model a head builds inside
            builds[cls.__name__] += 1
        inside.append(cls)
        try:
            init(self, config, *args, **kwargs)
        finally:
            inside.pop()

    return __init__


@pytest.fixture
def meta_builds(monkeypatch) -> Counter:
    """How many times each BERT class is built on the meta device, from an empty cache."""
    monkeypatch.setattr(validation, "_meta_models", {})
    builds, inside = Counter(), []
    for cls in BERT.models.values():
        monkeypatch.setattr(cls, "__init__", _counting(cls, cls.__init__, builds, inside))
    return builds


def _config():
    return build_config(BERT, {**BERT.tiny, "model_type": "bert"}, TARGET, Path("tiny"))


def test_each_class_is_built_once_and_only_when_asked_about(meta_builds):
    config = _config()
    shapes, _ = validation.expected_tensors(TARGET, config)
    dtypes = validation.expected_dtypes(TARGET, config)
    validation.check_tensors(BERT, TARGET, config, shapes, None, strict=True, dtypes=dtypes)
    assert meta_builds == {TARGET.__name__: 1}  # the target's own tensors: no other head is built
    # The pooler, which the masked-LM head lacks: found among the other heads' tensors, each built once.
    prefix = validation.our_prefix(BERT, TARGET)
    pooler = {k: v for k, v in validation.expected_tensors(BERT.base_model, config)[0].items() if ".pooler." in f".{k}"}
    assert pooler
    with_pooler = {**shapes, **{f"{prefix}.{k}" if prefix else k: shape for k, shape in pooler.items()}}
    for _ in range(2):
        validation.check_tensors(BERT, TARGET, config, with_pooler, None, strict=True, dtypes=dtypes)
    validation.expected_tensors(TARGET, _config())  # another object, the same content
    assert meta_builds == {cls.__name__: 1 for cls in BERT.models.values()}


def test_a_changed_config_is_built_again(meta_builds):
    config = _config()
    shapes, tied = validation.expected_tensors(TARGET, config)
    assert tied
    config.tie_word_embeddings = False  # as a conversion does when a tied copy differs from its source
    assert validation.expected_tensors(TARGET, config) == (shapes, {})
    config.num_hidden_layers = 1
    fewer, _ = validation.expected_tensors(TARGET, config)
    assert set(fewer) < set(shapes)
    assert meta_builds[TARGET.__name__] == 3
