"""Hub faults (issue 28, row 5) against the test's own Hub on 127.0.0.1 (hub_server.FrontHub, repos in memory):
429 and 500 answers, a download cut off halfway, a server slower than the timeout, an upload cut off halfway.
Downloads retry and resume with huggingface_hub's own mechanisms (a 429 and a cut-off body inside a file's request,
a Range request to resume) and fivefold's retry of the whole snapshot (5xx, timeouts, the repo-info call, which
huggingface_hub does not retry); whatever fails ends in one line naming the server's answer, with nothing written
at DST, and an upload that fails leaves the remote repo and the local folder as they were.

Each case is one `fivefold` command against a repo of its own, whose faults meet only its requests; the commands
run side by side, each a child of one warm interpreter started with the Hub's environment (HF_ENDPOINT is read at
import; tests/warm_python.py).
"""

import hashlib
import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
import warm_python
from filelock import FileLock
from hub_server import Fault, FrontHub, client_env, one_line_error
from launching import side_by_side

import fivefold
from fivefold.conversion.samples import build_stock_checkpoint

from helpers import read_tensors, shared_folder

pytestmark = pytest.mark.slow
TOKEN = "hf_fivefold_test_token"
WEIGHTS = "model.safetensors"

# `fivefold ARGV...`, its exit code and what it printed as one line of JSON.
CLIENT = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from fivefold.cli import main
    err, printed = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(printed):
        rc = main(sys.argv[1:])
    print(json.dumps({"rc": rc, "stderr": err.getvalue(), "stdout": printed.getvalue()}))
    """
)


def fault(repo: str, method: str, path: str, answer: str, times: int = 1, seconds: float = 5.0) -> dict:
    return dict(repo=repo, method=method, path=path, answer=answer, times=times, seconds=seconds)


def tree_hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")}


def run_clients(client: dict, commands: dict[str, list[str]]) -> dict[str, dict]:
    """Each `fivefold ARGV` side by side: name -> {"rc", "stderr", "stdout"}."""
    argvs = {name: [*client["python"], "-c", CLIENT, *argv] for name, argv in commands.items()}
    done = side_by_side(argvs, client["env"], timeout=180)
    for name, finished in done.items():
        assert finished.returncode == 0, f"{name}: {finished.stderr[-4000:]}"
    return {name: json.loads(finished.stdout.strip().splitlines()[-1]) for name, finished in done.items()}


LATE_S = 1  # the shared repo's weights answered this late: the two downloads overlap (within the 2 s timeouts)


def run_every_case(root: Path) -> dict:
    """Every command against the Hub at once, each on a repo of its own; what the tests read: each command's
    result, the requests the Hub saw (with their arrival times) for the repos whose log the tests read, and the
    pushed repos before and after."""
    hub = FrontHub(TOKEN, upstream=None)
    env = client_env(hub.url, root / "home", TOKEN)  # one Hub cache for every command
    env.update(HF_HUB_DOWNLOAD_TIMEOUT="2", HF_HUB_ETAG_TIMEOUT="2", FIVEFOLD_HUB_TIMEOUT="2")
    client = {"python": warm_python.start(env), "env": env}  # it imports while the repos are made
    # Weights of over 20 MB: huggingface_hub writes what it reads in chunks of 10 MB, so a body cut off halfway has
    # one chunk on disk, from where the retry resumes (a smaller file starts again from its first byte).
    stock = build_stock_checkpoint("bert", "BertForMaskedLM", root / "stock", vocab_size=200_000)
    assert (stock / WEIGHTS).stat().st_size > 20e6
    for name in ("resumed", "failing", "slow", "to-push", "shared"):
        hub.add_repo(f"org/{name}", stock)
    pushed = {name: hub.add_repo(name, stock) for name in ("org/pushed", "org/pushed-429")}
    fivefold.convert(stock, root / "ref", progress=False)  # what a download should give, and what is pushed
    hub.faults = [Fault(**f) for f in [
        # a 500 to the repo-info call, a 429 and a connection cut halfway through the weights: all recovered
        fault("org/resumed", "GET", "/revision", "500"), fault("org/resumed", "GET", WEIGHTS, "429"),
        fault("org/resumed", "GET", WEIGHTS, "drop"),
        fault("org/failing", "GET", WEIGHTS, "500", times=-1),
        fault("org/slow", "GET", "/revision", "slow", times=-1, seconds=4),
        fault("org/pushed", "POST", "/commit/", "drop"),
        fault("org/pushed-429", "POST", "/commit/", "429", times=-1),
        fault("org/new", "POST", "/commit/", "500", times=-1),
        fault("org/shared", "GET", WEIGHTS, "late", times=-1, seconds=LATE_S),
    ]]  # fmt: skip
    ref = str(root / "ref")
    commands = {
        "resumed": ["convert", "org/resumed", str(root / "resumed"), "-q"],
        "failing": ["convert", "org/failing", str(root / "failing"), "-q"],
        "slow": ["convert", "org/slow", str(root / "slow"), "-q"],
        "push-dropped": ["push", ref, "org/pushed"],
        "push-429": ["push", ref, "org/pushed-429"],
        "convert-push-500": ["convert", "org/to-push", str(root / "to-push"), "-q", "--push-to-hub", "org/new"],
        **{f"shared-{i}": ["convert", "org/shared", str(root / f"shared-{i}"), "-q"] for i in range(2)},
    }
    remote = {name: [dict(repo.branches), list(repo.messages)] for name, repo in pushed.items()}
    local = tree_hashes(root / "ref")
    try:
        results = run_clients(client, commands)
    finally:
        warm_python.close(client["python"])
        hub.close()
    return {
        "results": results,
        "log": {repo: hub.requests_for(repo) for repo in ("org/resumed", "org/slow", "org/shared")},
        "remote_before": remote,
        "remote_after": {name: [dict(repo.branches), list(repo.messages)] for name, repo in pushed.items()},
        "local_before": local,
        "repos_after": sorted(hub.repos),
    }


@pytest.fixture(scope="session")
def faulted(tmp_path_factory):
    """Every case run once a run: the first pytest-xdist worker to ask runs them, another reads what it wrote."""
    root = shared_folder(tmp_path_factory) / "hub-faults"
    with FileLock(f"{root}.lock"):
        if not (root / "report.json").exists():
            shutil.rmtree(root, ignore_errors=True)  # what a failed attempt left
            root.mkdir()
            report = run_every_case(root)
            (root / "report.json.tmp").write_text(json.dumps(report))
            os.replace(root / "report.json.tmp", root / "report.json")
    return {**json.loads((root / "report.json").read_text()), "root": root}


def test_a_download_recovers_from_429_500_and_a_connection_cut_halfway(faulted):
    results, root, log = faulted["results"], faulted["root"], faulted["log"]["org/resumed"]
    assert results["resumed"]["rc"] == 0, results
    got, expected = read_tensors(root / "resumed"), read_tensors(root / "ref")
    assert got.keys() == expected.keys() and all((got[k] == expected[k]).all() for k in expected)
    weights = [(m, r) for m, p, r, _ in log if m == "GET" and p.endswith(WEIGHTS) and "/resolve/" in p]
    assert len(weights) == 3, log  # answered 429, cut off halfway, then resumed
    assert weights[0][1] is None and weights[2][1] is not None and weights[2][1].startswith("bytes=")
    start = int(weights[2][1][len("bytes=") : -1])
    assert 0 < start < (root / "stock" / WEIGHTS).stat().st_size  # only the missing half again
    assert sum(p.endswith("/revision/main") for _, p, _, _ in log) == 2  # the repo info, retried by fivefold


def test_a_persistent_500_and_a_slow_server_are_one_line_and_write_nothing(faulted):
    results, root = faulted["results"], faulted["root"]
    line = one_line_error(results["failing"], "org/failing", "failed after 3 attempts", "500", WEIGHTS)
    assert "the test server answers 500" in line  # the server's own message
    timeout = ("did not answer in time", "FIVEFOLD_HUB_TIMEOUT")
    one_line_error(results["slow"], "org/slow", "failed after 3 attempts", *timeout)
    for name in ("failing", "slow"):
        assert not (root / name).exists()
    leftovers = [p.name for p in root.iterdir() if p.name.startswith(("failing", "slow"))]
    assert leftovers == [], leftovers  # no temporary folder beside DST
    assert sum(p.endswith("/revision/main") for _, p, _, _ in faulted["log"]["org/slow"]) == 3


def test_a_failed_upload_leaves_the_remote_repo_and_the_local_folder_as_they_were(faulted):
    results = faulted["results"]
    one_line_error(results["push-dropped"], "org/pushed", "nothing was pushed", "connection")
    one_line_error(results["push-429"], "org/pushed-429", "nothing was pushed", "429 Too Many Requests")
    assert faulted["remote_after"] == faulted["remote_before"]  # no half commit, no commit at all
    assert tree_hashes(faulted["root"] / "ref") == faulted["local_before"]  # byte for byte
    one_line_error(results["convert-push-500"], "org/new", "nothing was pushed", "500")
    assert "org/new" not in faulted["repos_after"]  # the repo made for the failed push is gone again


def test_two_processes_downloading_into_one_cache_both_get_the_whole_repo(faulted):
    """Both conversions ask for the same weights at once (each answer LATE_S late, so that the downloads overlap;
    the two start at the same instant): huggingface_hub's lock on the blob makes one wait for the other, and both
    convert what the repo holds."""
    results, root = faulted["results"], faulted["root"]
    expected = read_tensors(root / "ref")
    for i in range(2):
        assert results[f"shared-{i}"]["rc"] == 0, results[f"shared-{i}"]
        got = read_tensors(root / f"shared-{i}")
        assert got.keys() == expected.keys() and all((got[k] == expected[k]).all() for k in expected)
    cache = root / "home" / "hub" / "models--org--shared"
    assert not list(cache.rglob("*.incomplete")), list(cache.rglob("*"))
    asked = [(m, t) for m, p, _, t in faulted["log"]["org/shared"] if p.endswith("/" + WEIGHTS)]
    gets, heads = [t for m, t in asked if m == "GET"], [t for m, t in asked if m == "HEAD"]
    assert len(gets) == 1, asked  # downloaded once: the other process found it in the cache
    assert len(heads) >= 2 and max(heads) < gets[0] + LATE_S, asked  # both asked before the download ended
