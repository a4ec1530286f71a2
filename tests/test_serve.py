"""`transformers serve` answers /v1/completions and /v1/chat/completions for a fivefold folder on 127.0.0.1, streaming
and not: plainly through `--trust-remote-code` (fivefold never imported by the server), and with continuous batching
through `fivefold serve` (fivefold imported). Answers equal greedy `generate`; each server's process group is
killed at the end or at its timeout."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from launching import free_port
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from fivefold.serving import servable

PROMPT = "w5 w6 w7 w8"
NEW_TOKENS = 5
START_TIMEOUT = 300


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """One word per token id ("w17" is 17), with a chat template: the tiny checkpoints ship no tokenizer."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    return tokenizer


@pytest.fixture(scope="module")
def served(converted, tmp_path_factory):
    """A converted GPT-2 folder with a tokenizer, made servable; and the greedy continuation of PROMPT."""
    _, folder = converted("gpt2", "GPT2LMHeadModel")
    out = tmp_path_factory.mktemp("served") / "gpt2"
    shutil.copytree(folder, out)
    tokenizer = word_tokenizer(99)
    tokenizer.save_pretrained(out)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        tokens = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)[0, ids.shape[1] :]
    servable(out)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["AutoModelForCausalLM"]
    return out, tokenizer.decode(tokens, skip_special_tokens=True)


def _post(port: int, path: str, body: dict) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read().decode()


def _text(answer: str, stream: bool, chat: bool) -> str:
    if not stream:
        choice = json.loads(answer)["choices"][0]
        return choice["message"]["content"] if chat else choice["text"]
    parts = []
    for line in answer.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            choice = json.loads(line[6:])["choices"][0]
            parts.append((choice.get("delta", {}).get("content") if chat else choice.get("text")) or "")
    return "".join(parts)


def _wait_until_up(server: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server exited ({server.returncode}): {log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"the server did not answer within {START_TIMEOUT} s")


@contextlib.contextmanager
def running(server: str, log: Path) -> Iterator[tuple[int, int]]:
    """(port, pid) of a server started on 127.0.0.1, its output in `log` (a pipe would fill and block it under
    load); its process group killed on the way out."""
    port = free_port()
    command = [sys.executable, *SERVERS[server], "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_up(proc, port, log)
        yield port, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


SERVERS = {
    "remote-code": [
        "-c",
        "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; main()",
        "serve",
        "--trust-remote-code",
    ],
    "fivefold-continuous-batching": ["-m", "fivefold", "serve", "--continuous-batching", "--cb-num-blocks", "64"],
}


@pytest.mark.slow
@pytest.mark.parametrize("server", list(SERVERS))
def test_serve_answers_completions_and_chat(served, server, tmp_path):
    folder, expected = served
    with running(server, tmp_path / "server.log") as (port, _):
        for stream in (False, True):
            common = {"model": str(folder), "max_tokens": NEW_TOKENS, "temperature": 0, "stream": stream}
            completion = _post(port, "/v1/completions", {**common, "prompt": PROMPT})
            chat = _post(port, "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": PROMPT}]})
            assert _text(completion, stream, chat=False).split() == expected.split(), (server, stream, completion)
            assert _text(chat, stream, chat=True).split() == expected.split(), (server, stream, chat)


@pytest.mark.parametrize(
    ("model_type", "stock_name"), [("qwen2", "Qwen2ForCausalLM"), ("qwen3_moe", "Qwen3MoeForCausalLM")]
)
def test_fivefold_serve_parses_reasoning_and_tool_calls_as_for_stock(converted, model_type, stock_name):
    """Qwen's tokenizers ship no response template: the server picks one by the config's model type."""
    from transformers import AutoModelForCausalLM
    from transformers.cli.serving.utils import get_response_template

    from fivefold.serving import parse_responses_as_stock

    src, dst = converted(model_type, stock_name)
    stock, ours = (AutoModelForCausalLM.from_pretrained(folder) for folder in (src, dst))
    tokenizer = word_tokenizer(99)
    parse_responses_as_stock()
    assert type(ours).__name__.startswith("Fivefold")
    template = get_response_template(tokenizer, stock)
    assert template is not None and get_response_template(tokenizer, ours) == template
