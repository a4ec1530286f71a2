"""A load test of `fivefold serve --continuous-batching` on 127.0.0.1: 200 requests from 16 clients (completions and
chat, streaming and not, mixed prompt lengths), each answer equal to sequential greedy `generate` on the same folder,
none lost; three malformed requests sent among them (a body that is no JSON, a prompt past the context, `max_tokens`
10^9) each get one clear 4xx while the others go on; the server's memory is flat over the run (RSS after the
warm-up and at the end). Run with `-s` for the figures."""

import json
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from test_serve import _post, _text, running, served  # noqa: F401 (served: the fixture)
from transformers import AutoModelForCausalLM, AutoTokenizer

REQUESTS, CLIENTS = 200, 16
CONTEXT = 64  # the tiny GPT-2's n_positions
RSS_GROWTH_MB = 64  # allocator caches settle in the first requests; a leak of one answer each would pass this


def load(count: int, folder: str) -> list[dict]:
    """Requests of 2-24 words and 3-8 new tokens, alternately completions and chat, every third streamed."""
    rng = random.Random(0)
    requests = []
    for i in range(count):
        prompt = " ".join(f"w{rng.randint(3, 98)}" for _ in range(rng.randint(2, 24)))
        body = {"model": folder, "max_tokens": rng.randint(3, 8), "temperature": 0, "stream": i % 3 == 0}
        if i % 2:
            messages = [{"role": "user", "content": prompt}]
            requests.append({"path": "/v1/chat/completions", "body": {**body, "messages": messages}})
        else:
            requests.append({"path": "/v1/completions", "body": {**body, "prompt": prompt}})
    return requests


def prompt_of(request: dict) -> str:
    body = request["body"]
    return body["prompt"] if "prompt" in body else body["messages"][0]["content"]


def answer(port: int, request: dict) -> list[str]:
    body = request["body"]
    text = _post(port, request["path"], body)
    return _text(text, body["stream"], chat=request["path"].endswith("chat/completions")).split()


def refused(port: int, path: str, data: bytes) -> tuple[int, str]:
    """(status, body) of a request the server must refuse."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


@pytest.mark.slow
def test_two_hundred_requests_from_sixteen_clients(served, tmp_path):  # noqa: F811
    folder, _ = served
    requests = load(REQUESTS, str(folder))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    expected = []
    with torch.no_grad():
        for request in requests:
            ids = tokenizer(prompt_of(request), return_tensors="pt").input_ids
            tokens = model.generate(ids, max_new_tokens=request["body"]["max_tokens"], do_sample=False)
            expected.append(tokenizer.decode(tokens[0, ids.shape[1] :], skip_special_tokens=True).split())
    past_context = {"model": str(folder), "prompt": " ".join(["w7"] * (CONTEXT + 6)), "max_tokens": 4}
    bad = {
        "no JSON": ("/v1/completions", b'{"model": "' + str(folder).encode() + b'", "prompt": "w5'),
        "prompt past the context": ("/v1/completions", json.dumps(past_context).encode()),
        "max_tokens 10^9": ("/v1/chat/completions", json.dumps({**requests[1]["body"], "max_tokens": 10**9}).encode()),
    }

    with running("fivefold-continuous-batching", tmp_path / "server.log") as (port, pid):
        assert answer(port, requests[0]) == expected[0]  # loads the model, warms the manager up
        start_rss = rss_mb(pid)
        started = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            half = REQUESTS // 2
            answers = [pool.submit(answer, port, r) for r in requests[:half]]
            refusals = {name: pool.submit(refused, port, *sent) for name, sent in bad.items()}
            answers += [pool.submit(answer, port, r) for r in requests[half:]]
            answers = [a.result(timeout=300) for a in answers]
            refusals = {name: r.result(timeout=300) for name, r in refusals.items()}
        seconds = time.perf_counter() - started
        end_rss = rss_mb(pid)

    wrong = [i for i, (got, want) in enumerate(zip(answers, expected, strict=True)) if got != want]
    assert not wrong, f"{len(wrong)} answers differ from greedy generate, the first: request {wrong[0]}"
    for name, (status, body) in refusals.items():
        assert 400 <= status < 500, (name, status, body)
    assert "JSON" in refusals["no JSON"][1]
    assert f"at most {CONTEXT} positions" in refusals["prompt past the context"][1]
    assert "max_tokens 1000000000" in refusals["max_tokens 10^9"][1]
    print(
        f"\n{REQUESTS} requests from {CLIENTS} clients in {seconds:.1f} s ({REQUESTS / seconds:.1f} requests/s), "
        f"all equal to greedy generate; refused: "
        + "; ".join(f"{name} -> {status} {body[:120]}" for name, (status, body) in refusals.items())
        + f"; server RSS {start_rss:.0f} MB after the warm-up, {end_rss:.0f} MB at the end"
    )
    assert end_rss - start_rss < RSS_GROWTH_MB, (start_rss, end_rss)
