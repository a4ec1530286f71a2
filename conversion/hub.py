"""The Hub side of a conversion: fetching a source repo (revision, subfolder, token) and pushing a finished folder
in one commit, every failure one ConversionError."""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ConversionError

# The files a conversion reads from a Hub repo: config, weights, tokenizer and processor files, the model card and
# the sentence-transformers modules (modules.json, 1_Pooling/config.json, ...). `*` crosses folders in these.
_SIDE = ("*.json", "*.txt", "*.model", "README.md")

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
    """The repo's checkpoint files at `ref.revision`, safetensors weights if it has them, else .bin ones."""
    from huggingface_hub import snapshot_download

    prefix = f"{ref.subfolder.strip('/')}/" if ref.subfolder else ""

    def fetch(weights: str) -> Path:
        patterns = [prefix + p for p in (*_SIDE, weights)]
        kwargs = dict(revision=ref.revision, token=ref.token, allow_patterns=patterns)
        return Path(snapshot_download(repo_id, **kwargs)) / prefix

    folder = fetch("*.safetensors")
    if not any(folder.glob("*.safetensors")):  # legacy repos hold only .bin weights
        folder = fetch("*.bin")
    if not (folder / "config.json").is_file():
        where = f" in its folder {ref.subfolder}" if ref.subfolder else ""
        raise ConversionError(f"the Hub repo {repo_id} has no config.json{where} (revision {ref.revision or 'main'})")
    return folder


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
        raise ConversionError(f"pushing {folder} to {repo_id} failed, nothing was pushed: {_reason(e)}") from None
    return info.commit_url


def _reason(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__
