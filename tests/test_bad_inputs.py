"""Bad model inputs raise a clear ValueError before any block runs; odd but legal inputs (all padding) give
finite outputs. Every row runs over every model class of fivefold.architectures.ARCHITECTURES whose sample
inputs have the tensors the row needs (image models: see the note in docs/errors.md)."""

import functools
import inspect

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from torch import nn

from fivefold.architectures import ARCHITECTURES, architecture_for_config, stock_class_name
from fivefold.modeling.block import Block

MODEL_CLASSES = [pytest.param(cls, id=cls.__name__) for arch in ARCHITECTURES for cls in arch.models.values()]


@functools.cache
def _model(cls) -> torch.nn.Module:
    """A tiny random model of the class, built once (weights do not matter for refusals)."""
    arch = architecture_for_config(cls.config_class)
    torch.manual_seed(0)
    return cls(arch.config_class(**arch.tiny)).eval()


def _inputs(cls) -> dict:
    arch = architecture_for_config(cls.config_class)
    return arch.sample_inputs(_model(cls).config, stock_class_name(cls), 0)


def _needs(inputs: dict, *names: str) -> None:
    missing = [n for n in names if n not in inputs]
    if missing:
        pytest.skip(f"the sample inputs have no {', '.join(missing)}")


def _refused_before_any_block(model, match: str, **inputs) -> ValueError:
    """The error is raised, and raised before the first block runs: nothing heavy was computed."""
    ran = []
    hooks = [m.register_forward_pre_hook(lambda *a: ran.append(1)) for m in model.modules() if isinstance(m, Block)]
    try:
        with pytest.raises(ValueError, match=match) as err, torch.no_grad():
            model(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    assert not ran, "a block ran before the input was refused"
    return err.value


@pytest.mark.parametrize("cls", MODEL_CLASSES)
def test_token_ids_outside_vocabulary(cls):
    model, inputs = _model(cls), _inputs(cls)
    _needs(inputs, "input_ids")
    for bad in (model.get_input_embeddings().num_embeddings, -1):
        ids = inputs["input_ids"].clone()
        ids.view(-1)[1] = bad
        err = _refused_before_any_block(model, "outside the vocabulary", **{**inputs, "input_ids": ids})
        assert str(bad) in str(err)


@pytest.mark.parametrize("cls", MODEL_CLASSES)
def test_sequence_longer_than_position_table(cls):
    model, inputs = _model(cls), _inputs(cls)
    _needs(inputs, "input_ids")
    tables = [getattr(m, "position_embeddings", None) for m in model.modules()]
    tables = [t for t in tables if isinstance(t, nn.Embedding)]
    if not tables:
        pytest.skip("no learned position table")
    length = tables[0].num_embeddings + 1
    ids = inputs["input_ids"][..., :1].expand(*inputs["input_ids"].shape[:-1], length).clone()
    _refused_before_any_block(model, "max_position_embeddings", input_ids=ids)


@pytest.mark.parametrize("cls", MODEL_CLASSES)
def test_mismatched_attention_mask(cls):
    model, inputs = _model(cls), _inputs(cls)
    _needs(inputs, "input_ids", "attention_mask")
    _refused_before_any_block(
        model, "attention_mask has shape", **{**inputs, "attention_mask": inputs["attention_mask"][..., :-1]}
    )


@pytest.mark.parametrize("cls", MODEL_CLASSES)
@pytest.mark.parametrize("empty", ["no-tokens", "no-sequences"])
def test_empty_input(cls, empty):
    model, inputs = _model(cls), _inputs(cls)
    _needs(inputs, "input_ids")
    ids = inputs["input_ids"][..., :0] if empty == "no-tokens" else inputs["input_ids"][:0]
    _refused_before_any_block(model, "at least one sequence of at least one token", input_ids=ids)


# Image models: a picture of another size (without interpolate_pos_encoding) or another channel count.
IMAGE_CLASSES = [p for p in MODEL_CLASSES if "pixel_values" in _inputs(p.values[0])]


@pytest.mark.parametrize("cls", IMAGE_CLASSES)
@pytest.mark.parametrize(("dim", "match"), [(-1, "(?i)size"), (-3, "(?i)channel")], ids=["image-size", "channels"])
def test_wrong_image(cls, dim, match):
    model, inputs = _model(cls), _inputs(cls)
    pixels = inputs["pixel_values"]
    shape = list(pixels.shape)
    shape[dim] += 1 if dim == -3 else 8
    if dim == -1:
        shape[-2] += 8
    _refused_before_any_block(model, match, **{**inputs, "pixel_values": torch.zeros(shape, dtype=pixels.dtype)})


def _label_arguments(cls) -> list[str]:
    names = inspect.signature(cls.forward).parameters
    return [n for n in ("labels", "next_sentence_label", "start_positions", "end_positions") if n in names]


@pytest.mark.parametrize("cls", [p for p in MODEL_CLASSES if _label_arguments(p.values[0])])
def test_labels_with_the_wrong_shape(cls):
    model, inputs = _model(cls), _inputs(cls)
    _needs(inputs, "input_ids")
    shape = tuple(inputs["input_ids"].shape)
    # Wrong for every head: a batch of another size; and, where labels follow the inputs token by token (not
    # sequence-to-sequence targets, which have their own length), one token more than the inputs have.
    wrong_shapes = [(shape[0] + 1,), (shape[0] + 1, *shape[1:])]
    if not model.config.is_encoder_decoder:
        wrong_shapes.append((*shape[:-1], shape[-1] + 1))
    for wrong in wrong_shapes:
        for name in _label_arguments(cls):
            labels = torch.zeros(wrong, dtype=torch.long)
            err = _refused_before_any_block(model, f"{name} has shape", **{**inputs, name: labels})
            assert str(list(wrong)) in str(err)


def _class_id_cases():
    for arch in ARCHITECTURES:
        for auto, per_token in (("AutoModelForMaskedLM", True), ("AutoModelForSequenceClassification", False)):
            if auto in arch.models:
                yield pytest.param(arch.models[auto], per_token, id=arch.models[auto].__name__)


@pytest.mark.parametrize(("cls", "per_token"), list(_class_id_cases()))
def test_label_values_outside_the_classes(cls, per_token):
    model, inputs = _model(cls), _inputs(cls)
    classes = model.config.vocab_size if per_token else model.config.num_labels
    shape = inputs["input_ids"].shape if per_token else inputs["input_ids"].shape[:1]
    labels = torch.full(shape, -100 if per_token else 0, dtype=torch.long)
    labels.view(-1)[0] = classes
    with pytest.raises(ValueError, match=rf"labels must be class ids in \[0, {classes}\)"), torch.no_grad():
        model(**{**inputs, "labels": labels})


def test_token_type_out_of_range():
    model = _model(ARCHITECTURES[0].base_model)
    inputs = _inputs(ARCHITECTURES[0].base_model)
    with pytest.raises(ValueError, match="token_type_ids"):
        model(input_ids=inputs["input_ids"], token_type_ids=torch.full_like(inputs["input_ids"], 2))


def test_ids_and_embeds_together():
    model = _model(ARCHITECTURES[0].base_model)
    inputs = _inputs(ARCHITECTURES[0].base_model)
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model(input_ids=inputs["input_ids"], inputs_embeds=torch.zeros(3, 12, 32))


# --- all padding: legal, so answered like stock, never with NaN ---------------------------------------------


def _at_real_tokens(out, real: torch.Tensor) -> list[torch.Tensor]:
    """The outputs to compare: the hidden states at real input tokens (an encoder-decoder's encoder side), and
    an encoder-decoder's decoder output, whose every position is real."""
    first = next(iter(out.values()))  # a ModelOutput, or a dict of its tensors
    if out.get("encoder_last_hidden_state") is not None:
        return [out["encoder_last_hidden_state"][real], first]
    return [first[real]]


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.stock_model_type)
def test_all_padding_rows_give_finite_stock_like_outputs(arch, stock_checkpoint):
    """One row that is all padding (a data pipeline's filler) leaves the other rows exactly as they are without
    it, matches stock at every real token, and is finite itself; a batch that is all padding is finite too."""
    name = stock_class_name(arch.base_model)
    src = stock_checkpoint(arch.stock_model_type, name)
    stock = getattr(transformers, name).from_pretrained(src).eval()
    ours = arch.base_model.from_pretrained(src).eval()
    inputs = arch.sample_inputs(stock.config, name, 0)
    _needs(inputs, "input_ids", "attention_mask")
    pad = stock.config.pad_token_id if stock.config.pad_token_id is not None else 0
    padded = {k: v.clone() for k, v in inputs.items()}
    padded["attention_mask"][-1] = 0
    padded["input_ids"][-1] = pad
    real = padded["attention_mask"].bool()
    with torch.no_grad():
        got, want = ours(**padded), stock(**padded)
        without = ours(**{k: v[:-1] for k, v in padded.items()})
        everything_padded = {**padded, "attention_mask": torch.zeros_like(padded["attention_mask"])}
        all_pad = ours(**everything_padded)
    assert all(torch.isfinite(t).all() for t in got.values() if torch.is_tensor(t))
    for a, b in zip(_at_real_tokens(got, real), _at_real_tokens(want, real), strict=True):
        assert (a - b).abs().max() <= 1e-4
    kept = {k: v[:-1] for k, v in got.items() if torch.is_tensor(v)}
    for a, b in zip(_at_real_tokens(kept, real[:-1]), _at_real_tokens(without, real[:-1]), strict=True):
        assert (a - b).abs().max() <= 1e-5
    assert all(torch.isfinite(t).all() for t in all_pad.values() if torch.is_tensor(t))


# --- inputs of the wrong kind: the argument named, before any block runs ------------------------------------


def _wrong_kinds(ids: torch.Tensor, multiple_choice: bool) -> dict:
    cases = {"float": ids.float(), "bool": ids.bool(), "python-list": ids.tolist(), "0-D": ids.reshape(-1)[0]}
    cases["one-dim-too-many"] = ids[None]
    if not multiple_choice:  # [B, N, T] -> [N, T] is still a batch of choices
        cases["1-D"] = ids[0]
    return cases


@pytest.mark.parametrize("cls", MODEL_CLASSES)
def test_token_ids_of_the_wrong_kind(cls):
    model, inputs = _model(cls), _inputs(cls)
    _needs(inputs, "input_ids")
    labels = inputs.pop("labels", None)  # checked against the ids' shape; a seq2seq model decodes them instead
    if labels is not None and model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = labels.clamp(min=0)
    for case, ids in _wrong_kinds(inputs["input_ids"], inputs["input_ids"].dim() == 3).items():
        err = _refused_before_any_block(model, "input_ids must", **{**inputs, "input_ids": ids})
        if case in ("float", "bool"):
            assert "integer token ids" in str(err), case


@pytest.mark.parametrize("cls", [p for p in MODEL_CLASSES if p.values[0].config_class.model_type == "fivefold_t5"])
def test_decoder_input_ids_outside_vocabulary(cls):
    model, inputs = _model(cls), _inputs(cls)
    _needs(inputs, "decoder_input_ids")
    ids = inputs["decoder_input_ids"].clone()
    ids.view(-1)[1] = model.config.vocab_size
    err = _refused_before_any_block(model, "decoder_input_ids hold token ids outside the vocabulary", **{
        **inputs, "decoder_input_ids": ids
    })  # fmt: skip
    assert str(model.config.vocab_size) in str(err)


@pytest.mark.parametrize("cls", [p for p in MODEL_CLASSES if p.values[0].config_class.model_type == "fivefold_gpt2"])
def test_gpt2_token_type_ids_outside_vocabulary(cls):
    """GPT-2 reads token types from its word table: the error names token_type_ids, not input_ids."""
    model, inputs = _model(cls), _inputs(cls)
    types = torch.full_like(inputs["input_ids"], model.config.vocab_size)
    _refused_before_any_block(model, "token_type_ids hold token ids outside the vocabulary", **{
        **inputs, "token_type_ids": types
    })  # fmt: skip


def _text_model_taking(cls, argument: str) -> tuple:
    """The model and its sample inputs, for a text model whose forward takes `argument` (else skipped)."""
    model, inputs = _model(cls), _inputs(cls)
    _needs(inputs, "input_ids")
    if argument not in inspect.signature(cls.forward).parameters:
        pytest.skip(f"no {argument} argument")
    return model, inputs


@pytest.mark.parametrize("cls", MODEL_CLASSES)
def test_negative_position_ids(cls):
    model, inputs = _text_model_taking(cls, "position_ids")
    if not [m for m in model.modules() if isinstance(getattr(m, "position_embeddings", None), nn.Embedding)]:
        pytest.skip("no learned position table")
    positions = torch.arange(inputs["input_ids"].shape[-1]).expand_as(inputs["input_ids"]) - 1
    _refused_before_any_block(model, "position_ids must be >= 0", **{**inputs, "position_ids": positions})


def test_float_token_type_ids_and_labels():
    bert = next(a for a in ARCHITECTURES if a.stock_model_type == "bert")
    for cls in (bert.models["AutoModelForMaskedLM"], bert.models["AutoModelForTokenClassification"]):
        model, inputs = _model(cls), _inputs(cls)
        types = torch.zeros_like(inputs["input_ids"], dtype=torch.float32)
        _refused_before_any_block(model, "token_type_ids must hold integer token ids", **{
            **inputs, "token_type_ids": types
        })  # fmt: skip
        labels = torch.zeros_like(inputs["input_ids"], dtype=torch.float32)
        _refused_before_any_block(model, "labels must hold integer class ids", **{**inputs, "labels": labels})


@pytest.mark.parametrize("cls", MODEL_CLASSES)
def test_inputs_embeds_of_the_wrong_width(cls):
    model, inputs = _text_model_taking(cls, "inputs_embeds")
    width = model.get_input_embeddings().embedding_dim
    embeds = torch.zeros(*inputs["input_ids"].shape, width + 1)
    without_ids = {k: v for k, v in inputs.items() if k != "input_ids"}
    _refused_before_any_block(model, f"inputs_embeds has width {width + 1}", **without_ids, inputs_embeds=embeds)


@pytest.mark.parametrize("cls", IMAGE_CLASSES)
def test_empty_image_batch(cls):
    model, inputs = _model(cls), _inputs(cls)
    empty = {k: v[:0] for k, v in inputs.items()}
    _refused_before_any_block(model, "at least one image is needed", **empty)


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.stock_model_type)
@pytest.mark.parametrize("eps", [float("nan"), float("inf"), -1e-6], ids=["nan", "inf", "negative"])
def test_norm_epsilon_refused_at_config_time(arch, eps):
    """A norm epsilon that would make every output non-finite is refused when the config is built."""
    fields = arch.config_class.__dataclass_fields__
    name = next((n for n in ("layer_norm_eps", "layer_norm_epsilon", "norm_eps", "rms_norm_eps") if n in fields), None)
    if name is None:
        pytest.skip("this config fixes its norm epsilon (DistilBERT's 1e-12)")
    with pytest.raises((ValueError, StrictDataclassError), match=f"{name} must be a finite number >= 0"):
        arch.config_class(**{**arch.tiny, name: eps})
