"""Continuous batching on every decoder of the table: `generate_batch` and `generate(cache_implementation="paged")`
give the tokens of plain greedy `generate`, with fivefold installed and through remote code, with chunked prefill
and shared prefixes; a failed request raises, and a model the manager cannot feed refuses before it starts."""

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import continuous_api

from fivefold.architectures import ARCHITECTURES, stock_class_name

from helpers import NO_FIVEFOLD, generation_overrides

DECODERS = [arch for arch in ARCHITECTURES if "AutoModelForCausalLM" in arch.models]
NEW_TOKENS = 6
# Prompts of mixed lengths; the last two share a prefix of two full pages, which the paged cache may share.
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [20, 21, 22, 23, 24, 25, 26, 27, 30, 31]]
PROMPTS.append([*PROMPTS[2][:8], 40, 41, 42])
# Small pages and batches: a prompt longer than a batch is prefilled in chunks over several steps (chunked
# prefill), and sizing the cache from the machine's memory (the default) takes seconds.
SMALL = dict(num_blocks=48, page_size=4, max_batch_tokens=8)


@pytest.fixture(autouse=True)
def no_full_collections(monkeypatch):
    """The manager runs a full `gc.collect()` twice per run, ~2 s each in a test process holding the suite's
    objects (not in a server): not what these tests check."""
    monkeypatch.setattr(continuous_api, "gc", SimpleNamespace(collect=lambda *args: 0))


def greedy_config(model) -> GenerationConfig:
    # No end-of-sequence token: every request runs its NEW_TOKENS, whatever the random weights predict.
    return GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)


def plain_greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    config = greedy_config(model)
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), generation_config=config)[0, len(p) :].tolist() for p in prompts]


def load_decoder(arch, converted, attn_implementation: str):
    cls = arch.models["AutoModelForCausalLM"]
    _, folder = converted(arch.stock_model_type, stock_class_name(cls), **generation_overrides(arch))
    model = cls.from_pretrained(folder, attn_implementation=attn_implementation).eval()
    model.generation_config.eos_token_id = None  # else plain generate stops there and the manager does not
    return model, folder


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", DECODERS, ids=lambda a: a.stock_model_type)
def test_generate_batch_and_paged_generate_equal_greedy(arch, attn_implementation, converted):
    """Mixed prompt lengths under chunked prefill (sdpa; eager is switched to paged|eager by the manager)."""
    model, _ = load_decoder(arch, converted, attn_implementation)
    expected = plain_greedy(model, PROMPTS)
    outputs = model.generate_batch(
        PROMPTS, greedy_config(model), continuous_batching_config=ContinuousBatchingConfig(**SMALL), warmup=False
    )
    assert [outputs[f"req_{i}"].generated_tokens for i in range(len(PROMPTS))] == expected

    same_length = torch.tensor([PROMPTS[2], PROMPTS[3][:10]])  # paged generate takes every column as a token
    sequences = model.generate(
        same_length,
        generation_config=greedy_config(model),
        cache_implementation="paged",
        continuous_batching_config=ContinuousBatchingConfig(**SMALL),
        warmup=False,
    )  # [1, B, T + new]
    assert sequences[0, :, 10:].tolist() == plain_greedy(model, same_length.tolist())


def test_a_failed_request_raises(converted):
    """transformers' manager records a failed request's error and returns it empty; fivefold raises, naming it,
    here for a token id past the vocabulary."""
    model, _ = load_decoder(DECODERS[0], converted, "sdpa")
    past_vocabulary = [[model.config.vocab_size + 5]]
    with pytest.raises(RuntimeError, match=r"continuous batching failed for 1 of 1 requests \(req_0: .*vocab"):
        model.generate_batch(past_vocabulary, greedy_config(model), ContinuousBatchingConfig(**SMALL), warmup=False)
    with pytest.raises(RuntimeError, match="continuous batching failed"):
        model.generate(
            torch.tensor(past_vocabulary),
            generation_config=greedy_config(model),
            cache_implementation="paged",
            continuous_batching_config=ContinuousBatchingConfig(**SMALL),
            warmup=False,
        )


@pytest.mark.parametrize(
    "arch", [a for a in ARCHITECTURES if "AutoModelForSeq2SeqLM" in a.models], ids=lambda a: a.stock_model_type
)
def test_encoder_decoders_refuse_continuous_batching(arch, converted):
    """The manager feeds decoder-only rows (stock T5's requests fail there too): refused before it starts."""
    cls = arch.models["AutoModelForSeq2SeqLM"]
    _, folder = converted(arch.stock_model_type, stock_class_name(cls), **generation_overrides(arch))
    model = cls.from_pretrained(folder).eval()
    with pytest.raises(NotImplementedError, match="cannot run continuous batching"):
        model.generate_batch([[5, 6, 7]], greedy_config(model))
    with pytest.raises(NotImplementedError, match="cannot run continuous batching"):
        model.init_continuous_batching()


REMOTE = NO_FIVEFOLD + textwrap.dedent(
    """
    import json, torch, transformers
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    transformers.utils.logging.set_verbosity_error()
    jobs = json.loads(sys.argv[1])
    results = []
    for job in jobs:
        model = transformers.AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=True).eval()
        config = GenerationConfig(max_new_tokens=job["new"], do_sample=False, eos_token_id=None, pad_token_id=0)
        small = ContinuousBatchingConfig(**job["small"])
        outputs = model.generate_batch(job["prompts"], config, continuous_batching_config=small, warmup=False)
        paged = model.generate(
            torch.tensor(job["prompts"][:1]), generation_config=config, cache_implementation="paged",
            continuous_batching_config=ContinuousBatchingConfig(**job["small"]), warmup=False,
        )
        assert "fivefold" not in sys.modules
        batch = [outputs[f"req_{i}"].generated_tokens for i in range(len(job["prompts"]))]
        results.append({"module": type(model).__module__, "batch": batch, "paged": paged[0].tolist()})
    print(json.dumps(results))
    """
)


@pytest.mark.slow
def test_continuous_batching_through_remote_code(converted, tmp_path):
    """Every decoder loaded with trust_remote_code=True where fivefold cannot be imported: generate_batch and
    paged generate give fivefold's greedy tokens."""
    jobs, expected = [], []
    for arch in DECODERS:
        model, folder = load_decoder(arch, converted, "sdpa")
        jobs.append({"folder": str(folder), "prompts": PROMPTS, "new": NEW_TOKENS, "small": SMALL})
        expected.append(plain_greedy(model, PROMPTS))
    script = tmp_path / "remote_batching.py"
    script.write_text(REMOTE)
    run = subprocess.run(
        [sys.executable, str(script), json.dumps(jobs)], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    for arch, result, tokens in zip(DECODERS, results, expected, strict=True):
        assert not result["module"].startswith("fivefold"), arch.stock_model_type
        assert result["batch"] == tokens, arch.stock_model_type
        assert result["paged"] == [PROMPTS[0] + tokens[0]], arch.stock_model_type
