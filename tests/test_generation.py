"""generate() of every class that generates (GenerationMixin), for every architecture in the table: greedy, beam
and sampled decoding of the architecture's batched, padded prompts token for token equal to stock, with the same
scores; a prompt of one row without an attention mask; greedy decoding over a static cache, padded or not. (Cached
== uncached decoding: test_properties.py; T5 with the deeper decoder and the v1.1 flavour: test_t5.py.)"""

import pytest
import torch
import transformers

from fivefold.architectures import ARCHITECTURES, stock_class_name

from helpers import generation_overrides, stock_attention

NEW = 24
SEARCHES = {
    "greedy": dict(do_sample=False),
    "beam": dict(do_sample=False, num_beams=3, num_return_sequences=2),
    "sample": dict(do_sample=True, top_k=20, temperature=0.8),
}

GENERATING = [
    pytest.param(arch, cls, id=cls.__name__)
    for arch in ARCHITECTURES
    for cls in arch.models.values()
    if cls.can_generate()
]


@pytest.fixture(scope="module")
def pair(converted):
    """(stock, ours) with the same tiny random weights, per class and attention implementation."""
    cache = {}

    def make(arch, cls, attn: str = "sdpa"):
        if (cls, attn) not in cache:
            stock_name = stock_class_name(cls)
            src, dst = converted(arch.stock_model_type, stock_name, **generation_overrides(arch))
            stock_attn = stock_attention(stock_name, attn)
            stock = getattr(transformers, stock_name).from_pretrained(src, attn_implementation=stock_attn).eval()
            cache[cls, attn] = stock, cls.from_pretrained(dst, attn_implementation=attn).eval()
        return cache[cls, attn]

    return make


def _prompt(arch, model) -> dict:
    inputs = arch.sample_inputs(model.config, stock_class_name(type(model)), 0)
    return {k: inputs[k] for k in ("input_ids", "attention_mask")}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("search", list(SEARCHES))
@pytest.mark.parametrize(("arch", "cls"), GENERATING)
def test_generate_matches_stock(pair, arch, cls, search, attn, linear_path):
    stock, ours = pair(arch, cls, attn)
    prompt = _prompt(arch, ours)
    assert prompt["attention_mask"].min() == 0  # batched prompts of unequal lengths
    if not ours.config.is_encoder_decoder:
        assert prompt["attention_mask"][:, 0].min() == 0  # padded on the left, as prompts are
    settings = dict(max_new_tokens=NEW, min_new_tokens=NEW, return_dict_in_generate=True, output_scores=True)
    runs = []
    for model in (stock, ours):
        torch.manual_seed(7)
        with torch.no_grad():
            runs.append(model.generate(**prompt, **settings, **SEARCHES[search]))
    expected, got = runs
    assert torch.equal(expected.sequences, got.sequences)
    start = 1 if ours.config.is_encoder_decoder else prompt["input_ids"].shape[1]  # 1: the decoder's start token
    assert got.sequences.shape[1] == start + NEW
    for x, y in zip(expected.scores, got.scores, strict=True):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=0)  # -inf (blocked EOS, top-k) equal on both sides


@pytest.mark.parametrize(("arch", "cls"), GENERATING)
def test_generate_without_attention_mask_and_batch_of_one(pair, arch, cls):
    stock, ours = pair(arch, cls)
    ids = torch.tensor([[5, 17, 42, 8, 90]])
    kwargs = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    assert torch.equal(stock.generate(ids, **kwargs), ours.generate(ids, **kwargs))


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "one-row"])
@pytest.mark.parametrize(("arch", "cls"), GENERATING)
def test_generate_over_a_static_cache_matches_stock(pair, arch, cls, padded):
    """cache_implementation="static": generate hands the model a 4D mask over every slot of the cache (the
    decoder's, for T5), and the positions come from the cache's counter. A prompt without padding is prefilled
    under sdpa with no mask at all (torch's `is_causal`), the cache's free slots after it."""
    stock, ours = pair(arch, cls)
    prompt = _prompt(arch, ours) if padded else {"input_ids": torch.tensor([[5, 17, 42, 8, 90]])}
    settings = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, cache_implementation="static")
    settings |= dict(return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        expected, got = (model.generate(**prompt, **settings) for model in (stock, ours))
    assert torch.equal(expected.sequences, got.sequences)
    for x, y in zip(expected.scores, got.scores, strict=True):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=0)
