"""`fivefold serve`'s request limits (fivefold/request_limits.py) without a server: which requests are refused and
with what sentence, and that the middleware passes the others through with their body intact."""

import asyncio
import json

import pytest

from fivefold.request_limits import ContextLimit, request_problem

CONTEXT = 16
CHAT = [{"role": "user", "content": "a b c"}]


class WordTokenizer:
    """One token a word; a chat template that joins the messages' contents."""

    def __call__(self, text: str) -> dict:
        return {"input_ids": list(range(len(text.split())))}

    def apply_chat_template(self, messages, add_generation_prompt: bool, tokenize: bool) -> dict:
        return self(" ".join(m["content"] for m in messages))


def limits(model: str):
    return (CONTEXT, WordTokenizer()) if model == "tiny" else None


def completion(words: int, **fields) -> bytes:
    return json.dumps({"model": "tiny", "prompt": " ".join(["w"] * words), **fields}).encode()


@pytest.mark.parametrize(
    ("path", "body", "problem"),
    [
        ("/v1/completions", completion(4, max_tokens=12), None),
        ("/v1/completions", completion(4), None),  # the server's default length: generation stops at the context
        ("/v1/completions", completion(16, max_tokens=1), "the prompt is 16 tokens; tiny takes at most 16 positions"),
        ("/v1/completions", completion(4, max_tokens=13), "ask for at most 12 new tokens"),
        ("/v1/completions", completion(4, max_tokens=10**9), "max_tokens 1000000000 = 1000000004 are past"),
        ("/v1/completions", completion(4, max_tokens=0), "max_tokens must be a positive integer, got 0"),
        ("/v1/completions", completion(4, max_tokens="8"), "max_tokens must be a positive integer, got '8'"),
        ("/v1/completions", completion(4, max_tokens=True), "max_tokens must be a positive integer, got True"),
        (
            "/v1/chat/completions",
            json.dumps({"model": "tiny", "messages": CHAT, "max_completion_tokens": 14}).encode(),
            "ask for at most 13 new tokens",
        ),
        ("/v1/completions", b'{"model": "tiny", "prompt": ', None),  # no JSON: the server's own 422
        ("/v1/completions", json.dumps({"model": "unknown", "prompt": "w " * 99}).encode(), None),  # can't judge
        ("/v1/completions", json.dumps({"model": "tiny", "prompt": ["w"]}).encode(), None),  # the server's 400
    ],
)
def test_request_problem(path, body, problem):
    found = request_problem(path, body, limits)
    assert found == problem if problem is None else problem in found


def call(path: str, chunks: list[bytes]) -> tuple[list[dict], list[bytes]]:
    """(what the middleware sent, the body the app behind it received), the request's body sent in chunks."""
    sent, seen = [], []
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    async def behind(scope, receive, send):
        seen.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    scope = {"type": "http", "method": "POST", "path": path}
    asyncio.run(ContextLimit(behind, limits)(scope, receive, send))
    return sent, seen


def test_middleware_refuses_with_one_400_and_passes_the_rest_whole():
    body = completion(4, max_tokens=99)
    sent, seen = call("/v1/completions", [body[:10], body[10:]])
    assert not seen and sent[0]["status"] == 400
    assert "ask for at most 12 new tokens" in json.loads(sent[1]["body"])["error"]["message"]

    body = completion(4, max_tokens=3)
    sent, seen = call("/v1/completions", [body[:10], body[10:]])
    assert seen == [body] and sent[0]["status"] == 200
    sent, seen = call("/v1/models", [b""])  # not a generating endpoint: untouched
    assert seen == [b""]
