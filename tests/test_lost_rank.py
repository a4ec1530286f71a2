"""A lost rank never hangs the others (docs/errors.md): rank 1 of a 2-process job SIGKILLs itself in the middle of
an expert-parallel generate(), an expert-parallel training step and a DDP step. Under `torchrun` the agent sees its
worker die, stops the other (SIGTERM, about 1 s later here) and its summary names the lost rank and the signal.
Without an agent (the ranks started by hand), rank 0's next collective raises gloo's error on the dead peer's closed
connection (about 2 s here), naming the peer's address; the 30 s process-group timeout the worker sets bounds a peer
that stops answering without closing its connections. The four jobs run side by side."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from launching import WORKERS, free_port

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
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(WORKERS)}
    jobs = {}

    def start(command: list[str], env: dict) -> subprocess.Popen:
        return subprocess.Popen(
            command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip

    for case in CASES:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
        jobs[case] = start([*command, str(WORKERS / "lost_rank.py"), str(tmp_path), case], env)
    port, by_hand = free_port(), "by-hand"
    ranks = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for rank in (0, 1):
        rank_env = {**env, **ranks, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        command = [sys.executable, str(WORKERS / "lost_rank.py"), str(tmp_path), by_hand]
        jobs[f"{by_hand}-{rank}"] = start(command, rank_env)
    outputs, ended = {}, {}
    deadline = time.time() + 300  # start-up of eight interpreters on two cores, then the bound below
    for case, job in jobs.items():
        try:
            outputs[case], _ = job.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for other in jobs.values():
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            pytest.fail(f"{case}: the job outlived its lost rank (a hang)")
        ended[case] = time.time()
    for case in CASES:
        job, out = jobs[case], outputs[case]
        killed_at = tmp_path / f"{case}-killed-at"
        assert killed_at.exists(), f"{case}: rank 1 never reached its kill\n{out[-4000:]}"
        assert job.returncode != 0, out[-4000:]
        assert ended[case] - float(killed_at.read_text()) < BOUND_S, out[-4000:]
        assert "finished" not in out, out[-4000:]
        # torchrun's summary: the failed rank and the signal that ended it
        summary = out[out.index("Root Cause (first observed failure)") :] if "Root Cause" in out else ""
        assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", summary) and "Signal 9 (SIGKILL)" in summary, out[-4000:]
        pids = [int((tmp_path / f"{case}-pid-{rank}").read_text()) for rank in (0, 1)]
        assert not any(pid_alive(pid) for pid in pids), f"{case}: a rank outlived the job"

    rank_0, out = jobs[f"{by_hand}-0"], outputs[f"{by_hand}-0"]
    assert rank_0.returncode != 0 and "finished" not in out, out[-4000:]
    assert "Connection closed by peer" in out or "Connection reset by peer" in out, out[-4000:]
    assert ended[f"{by_hand}-0"] - float((tmp_path / f"{by_hand}-killed-at").read_text()) < BOUND_S, out[-4000:]
