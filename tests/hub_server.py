"""A Hub for tests on 127.0.0.1: olah (a real Hub mirror) serves local git repos for downloads, and a small server
in front of it speaks the Hub's commit API for uploads (create repo, preupload answering "regular", NDJSON commit)
and serves what was pushed (resolve, revision, tree). Requests for repos it does not hold go on to olah.

No installable server accepts uploads from huggingface_hub, hence the front server. olah pins an older psutil:
it lives in its own virtual environment (README, "Set up"), found through `olah_cli()`.
"""

import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


def olah_cli() -> str | None:
    """olah's command: FIVEFOLD_OLAH, the project's .olah venv (README set-up), or one on PATH."""
    for candidate in (os.environ.get("FIVEFOLD_OLAH"), REPO_ROOT / ".olah" / "bin" / "olah-cli"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return shutil.which("olah-cli")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def mirror_repo(mirrors: Path, repo_id: str, branches: dict[str, Path]) -> None:
    """A git repo olah serves as `repo_id`: each branch holds one folder's files."""
    repo = mirrors / "models" / repo_id
    repo.mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    for i, (branch, folder) in enumerate(branches.items()):
        if i:
            subprocess.run([*git, "checkout", "-q", "--orphan", branch], check=True)
            subprocess.run([*git, "rm", "-rq", "--cached", "."], check=True)
            for old in repo.iterdir():
                if old.name != ".git":
                    shutil.rmtree(old) if old.is_dir() else old.unlink()
        shutil.copytree(folder, repo, dirs_exist_ok=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", f"{branch}"], check=True)


@dataclass
class Repo:
    private: bool = False
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit sha
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> {path: content}
    messages: list[str] = field(default_factory=list)

    def commit(self, branch: str, files: dict[str, bytes], deleted: set[str], message: str) -> str:
        parent = self.commits.get(self.branches.get(branch, ""), {})
        tree = {p: c for p, c in {**parent, **files}.items() if p not in deleted}
        sha = hashlib.sha1(json.dumps([message, sorted((p, git_blob_sha(c)) for p, c in tree.items())]).encode())
        sha = hashlib.sha1((sha.hexdigest() + str(len(self.commits))).encode()).hexdigest()
        self.commits[sha], self.branches[branch] = tree, sha
        self.messages.append(message)
        return sha


@dataclass
class Fault:
    """What the server does instead of answering: `answer` is "500" or "429" (a status, 429 with Retry-After: 1),
    "drop" (half the body, then the connection closed: the response's for a GET, the request's for a POST), "slow"
    (no answer for `seconds`, then the connection closed) or "late" (the usual answer, `seconds` late), for requests
    whose method is `method` and whose path holds `/repo/` and `path`, the next `times` of them (-1: all). Faults of
    different repos never meet another repo's requests: clients of different repos can run side by side."""

    repo: str
    method: str
    path: str
    answer: str
    times: int = 1
    seconds: float = 5.0


class FrontHub:
    """The server clients talk to (HF_ENDPOINT): uploads kept in memory, everything else passed to olah."""

    def __init__(self, token: str, upstream: str | None):
        self.token, self.upstream, self.repos = token, upstream, {}
        self.fail_commits = False  # answer every commit with a server error
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Range header
        self.arrivals: list[float] = []  # time.monotonic() of each request, in the same order
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fault_for(self, method: str, path: str, range_: str | None) -> Fault | None:
        with self.lock:
            self.requests.append((method, path, range_))
            self.arrivals.append(time.monotonic())
            for fault in self.faults:
                if fault.method == method and f"/{fault.repo}/" in path and fault.path in path and fault.times != 0:
                    fault.times -= fault.times > 0
                    return fault
        return None

    def requests_for(self, repo_id: str) -> list[tuple[str, str, str | None, float]]:
        """The requests whose path names `repo_id` (as its files' and its API's paths do), in order of arrival, each
        with its arrival time."""
        arrived = zip(self.requests, self.arrivals, strict=True)
        return [(*request, t) for request, t in arrived if f"/{repo_id}/" in request[1]]

    def add_repo(self, repo_id: str, folder: Path) -> Repo:
        """A repo served from memory: the folder's files in one commit on main."""
        repo = self.repos[repo_id] = Repo()
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        repo.commit("main", {".gitattributes": GITATTRIBUTES, **files}, set(), "initial commit")
        return repo

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return repo.commits[repo.branches.get(revision, revision)]


def _handler(hub: FrontHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        # --- plumbing ---
        def _send(self, status: int, body: bytes = b"", headers: dict | None = None):
            head = self.command == "HEAD"
            self.send_response(status)
            for k, v in (headers or {}).items():
                if k != "Content-Length" or head:
                    self.send_header(k, v)
            if not (head and "Content-Length" in (headers or {})):  # a HEAD tells the size of what GET sends
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if getattr(self, "drop_halfway", False):
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
            elif not head:
                self.wfile.write(body)

        def _json(self, status: int, data, **headers):
            self._send(status, json.dumps(data).encode(), {"Content-Type": "application/json", **headers})

        def _error(self, status: int, code: str, message: str):
            self._json(status, {"error": message}, **{"X-Error-Code": code, "X-Error-Message": message})

        def _authorised(self) -> bool:
            return self.headers.get("Authorization", "") == f"Bearer {hub.token}"

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _proxy(self, body: bytes = b""):
            if hub.upstream is None:
                return self._error(404, "RepoNotFound", "repository not found")
            parts = urllib.parse.urlsplit(hub.upstream)
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "authorization")}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            hop = ("transfer-encoding", "connection", "content-length", "keep-alive")
            fwd = {k: v for k, v in resp.getheaders() if k.lower() not in hop}
            if self.command == "HEAD" and resp.getheader("Content-Length") is not None:
                fwd["Content-Length"] = resp.getheader("Content-Length")
            if "location" in {k.lower() for k in fwd}:
                fwd = {k: (v.replace(hub.upstream, hub.url) if k.lower() == "location" else v) for k, v in fwd.items()}
            self._send(resp.status, data, fwd)

        def _faulted(self) -> bool:
            """Answers with the fault this request meets, if any, and says whether it did. A dropped GET is answered
            later, by `_send`, with half its body; a dropped POST is read halfway and the connection closed."""
            fault = hub.fault_for(self.command, urllib.parse.urlsplit(self.path).path, self.headers.get("Range"))
            if fault is None:
                return False
            self.close_connection = True
            if fault.answer in ("500", "429"):
                retry = {"Retry-After": "1"} if fault.answer == "429" else {}
                message = f"the test server answers {fault.answer}"
                self._json(int(fault.answer), {"error": message}, **{"X-Error-Message": message, **retry})
            elif fault.answer == "slow":
                time.sleep(fault.seconds)
            elif fault.answer == "late":  # answered as usual, `seconds` late
                self.close_connection = False
                time.sleep(fault.seconds)
                return False
            elif self.command == "GET":
                self.drop_halfway = True
                return False
            else:
                self.rfile.read(int(self.headers.get("Content-Length") or 0) // 2)
            return True

        def _repo(self, repo_id: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is not None and repo.private and not self._authorised():
                return None
            return repo

        # --- routes ---
        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            if self._faulted():
                return
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            parts = path.strip("/").split("/")
            if path == "/api/agent-harnesses":
                return self._json(200, [])
            if path == "/api/whoami-v2":
                if not self._authorised():
                    return self._error(401, "Unauthorized", "invalid token")
                return self._json(200, {"name": "org", "type": "user", "orgs": [], "auth": {}})
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id, rest = "/".join(parts[2:4]), parts[4:]
                if repo_id in hub.repos:
                    repo = self._repo(repo_id)
                    if repo is None:
                        return self._error(401, "RepoNotFound", "repository not found")
                    if not rest or rest[0] == "revision":
                        return self._info(repo_id, repo, "/".join(rest[1:]) or "main")
                    if rest[0] == "tree":
                        return self._tree(repo, rest[1], "/".join(rest[2:]))
                    return self._error(404, "EntryNotFound", "not served here")
            elif len(parts) >= 5 and parts[2] == "resolve":
                repo_id = "/".join(parts[:2])
                if repo_id in hub.repos:
                    repo = self._repo(repo_id)
                    if repo is None:
                        return self._error(401, "RepoNotFound", "repository not found")
                    return self._resolve(repo_id, repo, parts[3], "/".join(parts[4:]))
            return self._proxy()

        def _sha(self, repo: Repo, revision: str) -> str | None:
            return repo.branches.get(revision) or (revision if revision in repo.commits else None)

        def _info(self, repo_id: str, repo: Repo, revision: str):
            sha = self._sha(repo, revision)
            if sha is None:
                return self._error(404, "RevisionNotFound", f"revision {revision} not found")
            files = repo.commits[sha]
            siblings = [{"rfilename": p, "size": len(c)} for p, c in sorted(files.items())]
            info = {"id": repo_id, "modelId": repo_id, "sha": sha, "private": repo.private, "siblings": siblings}
            self._json(200, {**info, "lastModified": "2026-01-01T00:00:00.000Z", "tags": [], "downloads": 0})

        def _tree(self, repo: Repo, revision: str, prefix: str):
            sha = self._sha(repo, revision)
            if sha is None:
                return self._error(404, "RevisionNotFound", f"revision {revision} not found")
            entries = [
                {"type": "file", "path": p, "size": len(c), "oid": git_blob_sha(c)}
                for p, c in sorted(repo.commits[sha].items())
                if not prefix or p.startswith(prefix.rstrip("/") + "/")
            ]
            self._json(200, entries)

        def _resolve(self, repo_id: str, repo: Repo, revision: str, file: str):
            sha = self._sha(repo, revision)
            if sha is None:
                return self._error(404, "RevisionNotFound", f"revision {revision} not found")
            if sha != revision:  # a branch: redirected to the commit, as the Hub does
                where = f"/{repo_id}/resolve/{sha}/{urllib.parse.quote(file)}"
                return self._send(307, b"", {"Location": where, "X-Repo-Commit": sha})
            content = repo.commits[sha].get(file)
            if content is None:
                return self._error(404, "EntryNotFound", f"{file} not found")
            etag = f'"{git_blob_sha(content)}"'
            headers = {"X-Repo-Commit": sha, "ETag": etag, "Accept-Ranges": "bytes"}
            start = _range_start(self.headers.get("Range"))
            if start:  # a download resumed where it broke off
                headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
                return self._send(206, content[start:], {**headers, "Content-Length": str(len(content) - start)})
            self._send(200, content, {**headers, "Content-Length": str(len(content))})

        def do_POST(self):
            if self._faulted():
                return
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            parts, body = path.strip("/").split("/"), self._body()
            if path.startswith("/fivefold-test/fail-commits/"):  # the tests' switch for server errors
                hub.fail_commits = path.endswith("/on")
                return self._json(200, {})
            if path == "/api/validate-yaml":
                return self._json(200, {"errors": [], "warnings": []})
            if not self._authorised():
                return self._error(401, "Unauthorized", "invalid credentials in Authorization header")
            if path == "/api/repos/create":
                request = json.loads(body)
                repo_id = f"{request['organization']}/{request['name']}" if request.get("organization") else ""
                if repo_id in hub.repos:
                    message = "You already created this model repo"
                    return self._json(
                        409, {"error": message, "url": f"{hub.url}/{repo_id}"}, **{"X-Error-Message": message}
                    )
                repo = hub.repos[repo_id] = Repo(private=request.get("visibility") == "private")
                repo.commit("main", {".gitattributes": GITATTRIBUTES}, set(), "initial commit")
                return self._json(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id, "id": repo_id})
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and "/".join(parts[2:4]) in hub.repos:
                repo_id, action, revision = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
                repo = hub.repos[repo_id]
                if action == "preupload":
                    tree = repo.commits.get(self._sha(repo, revision) or "", {})
                    files = [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": oid}
                        for f in json.loads(body)["files"]
                        for oid in [git_blob_sha(tree[f["path"]]) if f["path"] in tree else None]
                    ]
                    return self._json(200, {"files": files})
                if action == "commit":
                    return self._commit(repo_id, repo, revision, body)
            return self._error(404, "NotFound", f"{path} is not served here")

        def do_DELETE(self):
            body = self._body()
            if not self._authorised():
                return self._error(401, "Unauthorized", "invalid credentials in Authorization header")
            if urllib.parse.urlsplit(self.path).path == "/api/repos/delete":
                request = json.loads(body)
                hub.repos.pop(f"{request.get('organization')}/{request['name']}", None)
                return self._json(200, {})
            return self._error(404, "NotFound", "not served here")

        def _commit(self, repo_id: str, repo: Repo, revision: str, body: bytes):
            if hub.fail_commits:
                return self._error(500, "InternalError", "the test server refuses this commit")
            files, deleted, message = {}, set(), ""
            for line in body.splitlines():
                item = json.loads(line)
                value = item["value"]
                if item["key"] == "header":
                    message = value["summary"]
                elif item["key"] == "file":
                    files[value["path"]] = base64.b64decode(value["content"])
                elif item["key"] in ("deletedFile", "deletedFolder"):
                    deleted.add(value["path"])
                else:
                    return self._error(400, "BadRequest", f"{item['key']} is not accepted here")
            sha = repo.commit(revision, files, deleted, message)
            self._json(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{sha}", "commitOid": sha, "success": True})

    return Handler


def _range_start(header: str | None) -> int:
    """N of a `bytes=N-` Range header (the only form a resumed download sends), else 0."""
    if not header or not header.startswith("bytes=") or not header.endswith("-"):
        return 0
    return int(header[len("bytes=") : -1])


class Olah:
    """olah serving the git repos under `mirrors` offline, its upstream a dead port."""

    def __init__(self, cli: str, workdir: Path, mirrors: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        netloc = f"127.0.0.1:{self.port}"
        (workdir / "configs.toml").write_text(
            f'[basic]\nhost = "127.0.0.1"\nport = {self.port}\nrepos-path = "{workdir / "repos"}"\n'
            f'mirrors-path = ["{mirrors}"]\nhf-scheme = "http"\nhf-netloc = "127.0.0.1:9"\n'
            f'hf-lfs-netloc = "127.0.0.1:9"\nmirror-scheme = "http"\nmirror-netloc = "{netloc}"\n'
            f'mirror-lfs-netloc = "{netloc}"\n\n[accessibility]\noffline = true\n'
        )
        self.log = open(workdir / "olah.log", "wb")
        self.process = subprocess.Popen(
            [cli, "-c", "configs.toml"], cwd=workdir, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"olah exited: {(workdir / 'olah.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError("olah did not start within 60 s")

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
        self.log.close()


def client_env(endpoint: str, home: Path, token: str | None) -> dict[str, str]:
    """The environment of a Hub client subprocess: this endpoint, its own cache, online, no Xet, no telemetry."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1")
    env.update(HF_HUB_DISABLE_PROGRESS_BARS="1", OMP_NUM_THREADS="1", PYTHONPATH="")
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def one_line_error(result: dict, *words: str) -> str:
    """A client step's failure as the user sees it: exit status 2 and one line holding every one of `words`."""
    assert result["rc"] == 2, result
    line = result["stderr"].strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert all(w in line for w in words), line
    return line


def run_client(script: str, env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Runs a client step in a fresh interpreter (HF_ENDPOINT is read at import), its whole group killed on timeout."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        out, err = process.communicate()
        raise AssertionError(f"client step timed out after {timeout} s:\n{err[-4000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)
