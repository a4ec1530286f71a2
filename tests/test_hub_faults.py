"""Hub faults (issue 28, row 5) against the test's own Hub on 127.0.0.1 (hub_server.FrontHub, repos in memory):
429 and 500 answers, a download cut off halfway, a server slower than the timeout, an upload cut off halfway.
Downloads retry and resume with huggingface_hub's own mechanisms (a 429 and a cut-off body inside a file's request,
a Range request to resume) and fivefold's retry of the whole snapshot (5xx, timeouts, the repo-info call, which
huggingface_hub does not retry); whatever fails ends in one line naming the server's answer, with nothing written
at DST, and an upload that fails leaves the remote repo and the local folder as they were.

One client process runs every step in turn (HF_ENDPOINT is read at import); the server logs each request under
the step that made it.
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hub_server import FrontHub, client_env, one_line_error, run_client

import fivefold
from fivefold.conversion.samples import build_stock_checkpoint

from helpers import read_tensors

pytestmark = pytest.mark.slow
TOKEN = "hf_fivefold_test_token"
WEIGHTS = "model.safetensors"

# Each step: {"name", "faults", "argv"}: the server told the step's name and faults, then `fivefold ARGV` run.
STEPS = textwrap.dedent(
    """
    import contextlib, io, json, sys, urllib.request
    import huggingface_hub.constants
    from fivefold.cli import main
    results = {}
    for step in json.loads(sys.argv[1]):
        request = urllib.request.Request(
            f"{huggingface_hub.constants.ENDPOINT}/fivefold-test/step", method="POST",
            data=json.dumps({"name": step["name"], "faults": step["faults"]}).encode())
        urllib.request.urlopen(request).read()
        err, printed = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(printed):
            rc = main(step["argv"])
        results[step["name"]] = {"rc": rc, "stderr": err.getvalue(), "stdout": printed.getvalue()}
    print(json.dumps(results))
    """
)


def fault(method: str, path: str, answer: str, times: int = 1, seconds: float = 5.0) -> dict:
    return dict(method=method, path=path, answer=answer, times=times, seconds=seconds)


def tree_hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub-faults")
    hub = FrontHub(TOKEN, upstream=None)
    # Weights of over 20 MB: huggingface_hub writes what it reads in chunks of 10 MB, so a body cut off halfway has
    # one chunk on disk, from where the retry resumes (a smaller file starts again from its first byte).
    stock = build_stock_checkpoint("bert", "BertForMaskedLM", root / "stock", vocab_size=200_000)
    assert (stock / WEIGHTS).stat().st_size > 20e6
    for name in ("resumed", "failing", "slow", "to-push"):
        hub.add_repo(f"org/{name}", stock)
    pushed = hub.add_repo("org/pushed", stock)
    out = {name: root / name for name in ("resumed", "failing", "slow", "to-push", "ref")}
    fivefold.convert(stock, out["ref"], progress=False)  # what a download should give, and what is pushed
    env = client_env(hub.url, root / "home", TOKEN)
    env.update(HF_HUB_DOWNLOAD_TIMEOUT="2", HF_HUB_ETAG_TIMEOUT="2", FIVEFOLD_HUB_TIMEOUT="2")
    get = "/"
    step = {
        # a 500 to the repo-info call, a 429 and a connection cut halfway through the weights: all recovered
        "resumed": (["convert", "org/resumed", str(out["resumed"]), "-q"], [
            fault("GET", "/api/models/org/resumed/revision", "500"), fault("GET", get + WEIGHTS, "429"),
            fault("GET", get + WEIGHTS, "drop")]),
        "failing": (["convert", "org/failing", str(out["failing"]), "-q"], [
            fault("GET", get + WEIGHTS, "500", times=-1)]),
        "slow": (["convert", "org/slow", str(out["slow"]), "-q"], [
            fault("GET", "/api/models/org/slow/revision", "slow", times=-1, seconds=4)]),
        "push-dropped": (["push", str(out["ref"]), "org/pushed"], [
            fault("POST", "/api/models/org/pushed/commit/", "drop")]),
        "push-429": (["push", str(out["ref"]), "org/pushed"], [
            fault("POST", "/api/models/org/pushed/commit/", "429", times=-1)]),
        "convert-push-500": (["convert", "org/to-push", str(out["to-push"]), "-q", "--push-to-hub", "org/new"], [
            fault("POST", "/commit/", "500", times=-1)]),
    }  # fmt: skip
    steps = [dict(name=name, argv=argv, faults=faults) for name, (argv, faults) in step.items()]
    before = {"remote": dict(pushed.branches), "messages": list(pushed.messages), "local": tree_hashes(out["ref"])}
    done = run_client(STEPS, env, json.dumps(steps), timeout=180)
    hub.close()
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    yield dict(hub=hub, results=results, out=out, root=root, before=before)


def test_a_download_recovers_from_429_500_and_a_connection_cut_halfway(faulted):
    results, out, log = faulted["results"], faulted["out"], faulted["hub"].requests_by_step()["resumed"]
    assert results["resumed"]["rc"] == 0, results
    got, expected = read_tensors(out["resumed"]), read_tensors(out["ref"])
    assert got.keys() == expected.keys() and all((got[k] == expected[k]).all() for k in expected)
    weights = [(m, r) for m, p, r in log if m == "GET" and p.endswith(WEIGHTS) and "/resolve/" in p]
    assert len(weights) == 3, log  # answered 429, cut off halfway, then resumed
    assert weights[0][1] is None and weights[2][1] is not None and weights[2][1].startswith("bytes=")
    start = int(weights[2][1][len("bytes=") : -1])
    assert 0 < start < (faulted["root"] / "stock" / WEIGHTS).stat().st_size  # only the missing half again
    assert sum(p.endswith("/revision/main") for _, p, _ in log) == 2  # the repo info, retried by fivefold


def test_a_persistent_500_and_a_slow_server_are_one_line_and_write_nothing(faulted):
    results, out = faulted["results"], faulted["out"]
    line = one_line_error(results["failing"], "org/failing", "failed after 3 attempts", "500", WEIGHTS)
    assert "the test server answers 500" in line  # the server's own message
    timeout = ("did not answer in time", "FIVEFOLD_HUB_TIMEOUT")
    one_line_error(results["slow"], "org/slow", "failed after 3 attempts", *timeout)
    for name in ("failing", "slow"):
        assert not out[name].exists()
    leftovers = [p.name for p in faulted["root"].iterdir() if p.name.startswith(("failing", "slow"))]
    assert leftovers == [], leftovers  # no temporary folder beside DST
    log = faulted["hub"].requests_by_step()["slow"]
    assert sum(p.endswith("/revision/main") for _, p, _ in log) == 3


def test_a_failed_upload_leaves_the_remote_repo_and_the_local_folder_as_they_were(faulted):
    results, hub, before = faulted["results"], faulted["hub"], faulted["before"]
    ref = faulted["out"]["ref"]
    one_line_error(results["push-dropped"], "org/pushed", "nothing was pushed", "connection")
    one_line_error(results["push-429"], "org/pushed", "nothing was pushed", "429 Too Many Requests")
    assert hub.repos["org/pushed"].branches == before["remote"]  # no half commit, no commit at all
    assert hub.repos["org/pushed"].messages == before["messages"]
    assert tree_hashes(ref) == before["local"]  # byte for byte
    one_line_error(results["convert-push-500"], "org/new", "nothing was pushed", "500")
    assert "org/new" not in hub.repos  # the repo made for the failed push is gone again


def test_two_processes_downloading_into_one_cache_both_get_the_whole_repo(faulted, tmp_path):
    """Both conversions ask for the same weights at once (each answer 3 s late, so that the downloads overlap):
    huggingface_hub's lock on the blob makes one wait for the other, and both convert what the repo holds."""
    hub, ref = FrontHub(TOKEN, upstream=None), faulted["out"]["ref"]
    hub.add_repo("org/shared", faulted["root"] / "stock")
    env = client_env(hub.url, tmp_path / "home", TOKEN)  # one cache for both
    late = [fault("GET", "/" + WEIGHTS, "late", times=-1, seconds=3)]
    clients = []
    for i in range(2):
        argv = ["convert", "org/shared", str(tmp_path / f"dst-{i}"), "-q"]
        steps = [dict(name=f"client-{i}", argv=argv, faults=late)]
        clients.append(subprocess.Popen(
            [sys.executable, "-c", STEPS, json.dumps(steps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        ))  # fmt: skip
    try:
        outputs = [client.communicate(timeout=180) for client in clients]
    finally:
        for client in clients:
            if client.poll() is None:
                os.killpg(client.pid, 9)
        hub.close()
    for client, (out, err) in zip(clients, outputs, strict=True):
        assert client.returncode == 0, err[-3000:]
        assert all(r["rc"] == 0 for r in json.loads(out.strip().splitlines()[-1]).values()), out
    expected = read_tensors(ref)
    for i in range(2):
        got = read_tensors(tmp_path / f"dst-{i}")
        assert got.keys() == expected.keys() and all((got[k] == expected[k]).all() for k in expected)
    cache = tmp_path / "home" / "hub" / "models--org--shared"
    assert not list(cache.rglob("*.incomplete")), list(cache.rglob("*"))
    asked = [(r[0], t) for r, t in zip(hub.requests, hub.arrivals, strict=True) if r[1].endswith("/" + WEIGHTS)]
    gets, heads = [t for m, t in asked if m == "GET"], [t for m, t in asked if m == "HEAD"]
    assert len(gets) == 1, asked  # downloaded once: the other process found it in the cache
    assert len(heads) >= 2 and max(heads) < gets[0] + 3, asked  # both asked for it before the download ended
