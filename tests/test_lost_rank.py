"""A lost rank never hangs the others (docs/errors.md): rank 1 of a 2-process job SIGKILLs itself in the middle of
an expert-parallel generate(), an expert-parallel training step and a DDP step. Under `torchrun` the agent sees its
worker die, stops the other (SIGTERM) if gloo's error on the lost connection has not ended it already, and its
summary lists every failed rank: the lost one with its signal. Its "Root Cause (first observed failure)" is the
lost rank unless the other exited within the same look of the agent's (every 0.1 s): then both are seen at once and
it names rank 0. Without an agent (the ranks started by hand), rank 0's next collective raises gloo's error on the
dead peer's closed connection, naming the peer's address; the 30 s process-group timeout the worker sets bounds a
peer that stops answering without closing its connections. The four jobs run side by side, their ranks forked from
the warm interpreter (tests/launching.py)."""

import os
import re
import subprocess
import time

import pytest
from launching import WORKERS, end, environment, free_port, python, torchrun_command

CASES = ("ep-generate", "ep-train", "ddp")
BOUND_S = 60  # from the kill to the end of the whole job


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_naming_it(tmp_path):
    env = environment()
    jobs = {}

    def start(command: list[str], env: dict) -> subprocess.Popen:
        return subprocess.Popen(
            command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip

    for case in CASES:
        jobs[case] = start(torchrun_command([str(WORKERS / "lost_rank.py"), str(tmp_path), case], 2, warmed=True), env)
    port, by_hand = free_port(), "by-hand"
    ranks = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for rank in (0, 1):
        rank_env = {**env, **ranks, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        command = [*python(warmed=True), str(WORKERS / "lost_rank.py"), str(tmp_path), by_hand]
        jobs[f"{by_hand}-{rank}"] = start(command, rank_env)
    outputs, ended = {}, {}
    deadline = time.time() + 300  # start-up of three torchrun agents and the ranks, then the bound below
    for case, job in jobs.items():
        try:
            outputs[case], _ = job.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            end(list(jobs.values()))
            pytest.fail(f"{case}: the job outlived its lost rank (a hang)")
        ended[case] = time.time()
    for case in CASES:
        job, out = jobs[case], outputs[case]
        killed_at = tmp_path / f"{case}-killed-at"
        assert killed_at.exists(), f"{case}: rank 1 never reached its kill\n{out[-4000:]}"
        assert job.returncode != 0, out[-4000:]
        assert ended[case] - float(killed_at.read_text()) < BOUND_S, out[-4000:]
        assert "finished" not in out, out[-4000:]
        # torchrun's summary of the failed ranks: the lost rank and the signal that ended it
        failures = re.split(r"\n\[\d+\]:\n", out[out.index("Failures:") :] if "Root Cause" in out else "")
        lost = [f for f in failures if re.search(r"rank\s*:\s*1 \(local_rank: 1\)", f) and "Signal 9 (SIGKILL)" in f]
        assert lost, out[-4000:]
        pids = [int((tmp_path / f"{case}-pid-{rank}").read_text()) for rank in (0, 1)]
        assert not any(pid_alive(pid) for pid in pids), f"{case}: a rank outlived the job"

    rank_0, out = jobs[f"{by_hand}-0"], outputs[f"{by_hand}-0"]
    assert rank_0.returncode != 0 and "finished" not in out, out[-4000:]
    assert "Connection closed by peer" in out or "Connection reset by peer" in out, out[-4000:]
    assert ended[f"{by_hand}-0"] - float((tmp_path / f"{by_hand}-killed-at").read_text()) < BOUND_S, out[-4000:]
