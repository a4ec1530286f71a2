"""`fivefold serve`'s answer to requests past the model's context: one 400 naming the limit, before generation starts.

transformers 5.24's server checks a request's fields but not its size: a prompt longer than the model's context, or
`max_tokens` past it (10^9), reaches generation, where a learned position table's error (fivefold's GPT-2:
"sequence too long for the position table") becomes a 500 without the reason, and a rotary model generates past the
length it was trained for. `ContextLimit` is ASGI middleware in front of the server's
app: it reads a completion or chat request's body, counts the prompt's tokens with the model's own tokenizer (and
chat template), and refuses with 400 a prompt that leaves no room for new tokens, a `max_tokens` that is no
positive integer, and a prompt plus `max_tokens` past `max_position_embeddings`, as OpenAI's API and vLLM do.
Anything it cannot judge (a body that is no JSON object, a model it cannot load) goes on to the server unchanged,
whose own checks answer it.

`LimitedServe` is transformers' `Serve` command with that middleware put in front of its app before the server
starts: nothing of transformers is patched.
"""

import functools
import json
from collections.abc import Awaitable, Callable

from transformers import AutoConfig, AutoTokenizer
from transformers.cli.serve import Serve

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")


@functools.lru_cache(maxsize=8)
def model_limits(model: str) -> tuple[int, object] | None:
    """(the model's context in positions, its tokenizer), or None where the folder says no context or won't load."""
    try:
        config = AutoConfig.from_pretrained(model)
        context = getattr(config, "max_position_embeddings", None)
        return (context, AutoTokenizer.from_pretrained(model)) if isinstance(context, int) else None
    except (OSError, ValueError, KeyError):
        return None


def prompt_length(path: str, request: dict, tokenizer) -> int | None:
    """The prompt's tokens as the server will feed them (the chat template applied for chat), None if unreadable."""
    try:
        if path == "/v1/completions":
            prompt = request.get("prompt", "")
            return len(tokenizer(prompt)["input_ids"]) if isinstance(prompt, str) else None
        ids = tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding, or ids
    except (KeyError, TypeError, ValueError):
        return None


def request_problem(path: str, body: bytes, limits: Callable[[str], tuple[int, object] | None]) -> str | None:
    """Why this request can never be served, in one sentence; None where it can (or where the server should judge)."""
    try:
        request = json.loads(body)
    except ValueError:
        return None  # the server answers 422 for a body that is no JSON
    if not isinstance(request, dict) or not isinstance(request.get("model"), str):
        return None
    new = next((request[f] for f in MAX_TOKEN_FIELDS if request.get(f) is not None), None)
    if new is not None and (not isinstance(new, int) or isinstance(new, bool) or new < 1):
        return f"max_tokens must be a positive integer, got {new!r}"
    found = limits(request["model"])
    if found is None:
        return None
    context, tokenizer = found
    prompt = prompt_length(path, request, tokenizer)
    if prompt is None:
        return None
    if prompt >= context:
        return f"the prompt is {prompt} tokens; {request['model']} takes at most {context} positions"
    if new is not None and prompt + new > context:
        return (
            f"the prompt's {prompt} tokens + max_tokens {new} = {prompt + new} are past the context of "
            f"{request['model']}, {context} positions: ask for at most {context - prompt} new tokens"
        )
    return None


class ContextLimit:
    """ASGI middleware: completion and chat requests past the model's context get a 400, the rest go on."""

    def __init__(self, app: Callable[..., Awaitable[None]], limits=model_limits):
        self.app = app
        self.limits = limits

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in ENDPOINTS:
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = request_problem(scope["path"], body, self.limits)
        if problem is not None:
            answer = json.dumps({"error": {"message": problem, "type": "invalid_request_error"}}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            return await send({"type": "http.response.body", "body": answer})
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


class LimitedServe(Serve):
    """`transformers serve` with ContextLimit in front of its app. Runs with `--non-blocking` (the server in a
    thread, set up before it starts): `serve` waits on that thread."""

    running: "LimitedServe | None" = None

    def start_server(self) -> None:
        self.server.config.app = ContextLimit(self.server.config.app)
        LimitedServe.running = self
        super().start_server()
