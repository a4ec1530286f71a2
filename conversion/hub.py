"""The Hub side of a conversion: fetching a source repo (revision, subfolder, token) and pushing a finished folder
in one commit, every failure one ConversionError."""

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import ConversionError

# The files a conversion reads from a Hub repo: config, weights, tokenizer and processor files, the model card and
# the sentence-transformers modules (modules.json, 1_Pooling/config.json, ...). `*` crosses folders in these.
_SIDE = ("*.json", "*.txt", "*.model", "*.jinja", "README.md")  # "*" reaches into folders: named chat templates

DOWNLOAD_ATTEMPTS = 3  # a download failing for the server's side (5xx, 429, a timeout, a dropped connection)
_TRANSIENT = (408, 429, 500, 502, 503, 504)

# A Hub repo id: `name` or `namespace/name` (huggingface_hub's own rules, less the length limit).
_REPO_ID = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$")


@dataclass(frozen=True)
class HubRef:
    """Where on the Hub a checkpoint is: the branch, tag or commit, the folder inside the repo, the token."""

    revision: str | None = None
    subfolder: str | None = None
    token: str | bool | None = None


LATEST = HubRef()  # the default branch, the repo's top folder, the stored token


def looks_local(src: str) -> bool:
    """A path that cannot be a Hub repo id (or whose parent folder exists here): missing means mistyped."""
    if not _REPO_ID.match(src) or "--" in src or ".." in src or src.startswith((".", "-")):
        return True
    parent = Path(src).parent
    return str(parent) != "." and parent.is_dir()


def download(repo_id: str, ref: HubRef) -> Path:
    """The repo's checkpoint files at `ref.revision`, safetensors weights if it has them, else .bin ones.

    huggingface_hub retries a file's request on 408 and 429 and resumes a body cut off halfway (a Range request);
    its repo-info call and other answers (5xx, a timeout) it does not retry. Those are retried here, as a whole
    `snapshot_download` again, which finds the files it has already fetched in the cache. What is left failing is one
    ConversionError naming the server's answer."""
    from huggingface_hub import snapshot_download

    prefix = f"{ref.subfolder.strip('/')}/" if ref.subfolder else ""

    def fetch(weights: str) -> Path:
        patterns = [prefix + p for p in (*_SIDE, weights)]
        kwargs = dict(revision=ref.revision, token=ref.token, allow_patterns=patterns)
        for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
            try:
                return Path(snapshot_download(repo_id, **kwargs)) / prefix
            except Exception as e:
                cause = _server_side(e)
                if cause is None:
                    raise
                if attempt == DOWNLOAD_ATTEMPTS:
                    raise ConversionError(
                        f"downloading {repo_id} from the Hub failed after {attempt} attempts: {_answer(cause)}"
                    ) from None
                time.sleep(2 ** (attempt - 1))

    folder = fetch("*.safetensors")
    if not any(folder.glob("*.safetensors")):  # legacy repos hold only .bin weights
        folder = fetch("*.bin")
    if not (folder / "config.json").is_file():
        where = f" in its folder {ref.subfolder}" if ref.subfolder else ""
        raise ConversionError(f"the Hub repo {repo_id} has no config.json{where} (revision {ref.revision or 'main'})")
    return folder


def _http_client():
    """The HTTP library huggingface_hub speaks through (httpx2 from 2.x, httpx before)."""
    try:
        import httpx2

        return httpx2
    except ModuleNotFoundError:
        import httpx

        return httpx


def _chain(e: BaseException):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def _server_side(e: Exception) -> BaseException | None:
    """The transient failure behind `e` (huggingface_hub wraps some in a LocalEntryNotFoundError), or None."""
    from huggingface_hub.errors import HfHubHTTPError

    link = _network_failure(e)
    if isinstance(link, HfHubHTTPError):
        return link if link.response is not None and link.response.status_code in _TRANSIENT else None
    return link if isinstance(link, _http_client().TransportError) else None


def _answer(e: BaseException) -> str:
    """The server's answer in a few words: its status and message, or what the connection did."""
    from huggingface_hub.errors import HfHubHTTPError

    httpx = _http_client()
    if isinstance(e, HfHubHTTPError) and e.response is not None:
        r = e.response
        said = f": {e.server_message.strip()}" if e.server_message else ""
        answer = f"the server answered {r.status_code} {r.reason_phrase} to {r.request.method} {r.url}{said}"
        return " ".join(answer.split())
    if isinstance(e, httpx.TimeoutException):
        limit = f"{HUB_TIMEOUT}, HF_HUB_DOWNLOAD_TIMEOUT, HF_HUB_ETAG_TIMEOUT: seconds"
        return f"the server did not answer in time ({limit}): {_reason(e)}"
    if isinstance(e, httpx.TransportError):
        return f"the connection failed: {_reason(e)}"
    return _reason(e)


def _network_failure(e: Exception) -> BaseException:
    """The server's answer or the connection's failure behind `e`, else `e` itself."""
    from huggingface_hub.errors import HfHubHTTPError

    httpx = _http_client()
    kinds = (HfHubHTTPError, httpx.TransportError)
    return next((link for link in _chain(e) if isinstance(link, kinds)), e)


HUB_TIMEOUT = "FIVEFOLD_HUB_TIMEOUT"  # seconds an answer of the Hub's API may take at most (fivefold's CLI)


def bound_hub_requests() -> None:
    """Gives huggingface_hub's requests a finite timeout: its client has none, and its API calls (the repo info, the
    file tree, a commit) pass none, so a server that takes the connection and never answers hangs the caller. Each
    limit a request leaves open becomes FIVEFOLD_HUB_TIMEOUT seconds (60 by default; HF_HUB_ETAG_TIMEOUT to
    connect); a file's body keeps HF_HUB_DOWNLOAD_TIMEOUT, which huggingface_hub passes itself. Set through its own
    `set_client_factory`, by fivefold's command line, which owns its process; a program calling fivefold's Python
    API keeps the client it has."""
    import huggingface_hub
    from huggingface_hub import constants

    seconds = float(os.environ.get(HUB_TIMEOUT) or 60)
    default = dict(connect=float(constants.HF_HUB_ETAG_TIMEOUT), read=seconds, write=seconds, pool=seconds)
    stock_factory = huggingface_hub.utils._http.default_client_factory

    def bound(request) -> None:  # an httpx request hook: runs before the transport reads the limits
        given = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {k: v if given.get(k) is None else given[k] for k, v in default.items()}

    def bounded_client():
        client = stock_factory()
        hooks = client.event_hooks
        client.event_hooks = {**hooks, "request": [*hooks.get("request", []), bound]}
        return client

    huggingface_hub.set_client_factory(bounded_client)


def _token(token: str | bool | None) -> str:
    from huggingface_hub import get_token

    found = token if isinstance(token, str) else (get_token() if token is not False else None)
    if not found:
        raise ConversionError("pushing to the Hub needs a token: pass --token, set HF_TOKEN or run `hf auth login`")
    return found


def check_can_push(token: str | bool | None) -> None:
    """Fails before any work when no token is there to push with."""
    _token(token)


def push_folder(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    private: bool | None = None,
    commit_message: str | None = None,
    revision: str | None = None,
    subfolder: str | None = None,
    token: str | bool | None = None,
) -> str:
    """Uploads every file of `folder` to `repo_id` (created if missing) in one commit; returns the commit's URL.

    A failed upload (no token, no network, a server error) raises one ConversionError; the commit is all or
    nothing, and a repo this call created is deleted again.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ConversionError(f"{folder} is not a checkpoint folder (no config.json) to push")
    if not _REPO_ID.match(repo_id):
        raise ConversionError(f"{repo_id!r} is not a Hub repo id (namespace/name)")
    api, created = HfApi(token=_token(token)), False
    try:
        try:
            api.create_repo(repo_id, private=private)
            created = True
        except HfHubHTTPError as e:
            if e.response is None or e.response.status_code != 409:  # 409: it exists already
                raise
        if revision is not None:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            path_in_repo=subfolder or None,
            commit_message=commit_message or f"Upload {folder.name} (converted with fivefold)",
            revision=revision,
        )
    except Exception as e:
        if created:
            try:
                api.delete_repo(repo_id)
            except Exception:
                pass  # the repo holds only what the Hub creates with it; the error below says what failed
        answer = _answer(_network_failure(e))
        raise ConversionError(f"pushing {folder} to {repo_id} failed, nothing was pushed: {answer}") from None
    return info.commit_url


def _reason(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__
