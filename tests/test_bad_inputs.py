"""Bad model inputs raise a clear error before any heavy compute."""

import pytest
import torch
import transformers

from fivefold.conversion.samples import text_inputs


@pytest.fixture(scope="module")
def models(converted):
    return {
        name: transformers.AutoModel.from_pretrained(converted(name, stock)[1]).eval()
        for name, stock in [("bert", "BertModel"), ("roberta", "RobertaModel")]
    }


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_token_ids_outside_vocabulary(models, name):
    model = models[name]
    inputs = text_inputs(model.config)
    for bad in (model.config.vocab_size, -1):
        ids = inputs["input_ids"].clone()
        ids[0, 1] = bad
        with pytest.raises(ValueError, match="outside the vocabulary"):
            model(input_ids=ids)


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_sequence_longer_than_position_table(models, name):
    model = models[name]
    ids = torch.full((1, model.config.max_position_embeddings + 1), 5)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=ids)


def test_mismatched_attention_mask(models):
    model = models["bert"]
    inputs = text_inputs(model.config)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"][:, :-1])


def test_token_type_out_of_range(models):
    model = models["bert"]
    inputs = text_inputs(model.config)
    with pytest.raises(ValueError, match="token_type_ids"):
        model(input_ids=inputs["input_ids"], token_type_ids=torch.full_like(inputs["input_ids"], 2))


def test_ids_and_embeds_together(models):
    model = models["bert"]
    inputs = text_inputs(model.config)
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model(input_ids=inputs["input_ids"], inputs_embeds=torch.zeros(3, 12, 32))
