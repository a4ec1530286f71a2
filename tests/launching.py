"""Starting N gloo processes from a test: a free port, torchrun's environment, each process group killed when time
runs out (a hang fails the test, never CI), and every rank's output in the failure message.

`launch`'s ranks, and with `warmed=True` (`python`, `torchrun_command`) any process, are children forked from one
interpreter per test session that has imported torch, transformers (Trainer too), fivefold and
torch.distributed.checkpoint once (tests/warm_python.py): `import fivefold` is 5-12 s of every fresh interpreter,
most of a small multi-process test.
It is still a process of its own, started from a state no other process or earlier run touched; its launcher
(torchrun's agent, or the test) sees it end as it ended, by its exit code or by its signal."""

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import warm_python

WORKERS = Path(__file__).parent / "workers"
PRELOAD = (*warm_python.PRELOAD, "transformers.trainer", "torch.distributed.checkpoint", "fivefold.training_state")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def _base_environment() -> dict:
    """Every launched process's environment, fixed at the first launch (the warm interpreter's own). Relaunches
    under torchrun read a rendezvous store of their own: torch 2.13's shared one keeps the dead ranks' addresses,
    and a relaunched rank could read them (gloo's connectFullMesh then fails, "Connection refused")."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(WORKERS), env.get("PYTHONPATH", "")])
    return env


def environment(extra: dict | None = None) -> dict:
    """The environment of a launched process: the base one (see above) and `extra`."""
    return {**_base_environment(), **(extra or {})}


@functools.cache
def warm() -> list[str]:
    """The command prefix that runs `python ARGS...` as a child of this session's warm interpreter."""
    return warm_python.start(_base_environment(), PRELOAD)


def python(warmed: bool) -> list[str]:
    """The command prefix of `python ARGS...`: a fresh interpreter, or a child of the warm one."""
    return warm() if warmed else [sys.executable]


def end(procs: list[subprocess.Popen], grace_s: float = 5) -> None:
    """Ends every process still running with its process group (each was started in a session of its own):
    SIGTERM first, so that torchrun's agent stops its ranks, which run in sessions of their own; SIGKILL after
    `grace_s`."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in running:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _run(commands: list[list[str]], envs: list[dict], timeout: float, cwd: Path) -> list[str]:
    logs = [tempfile.TemporaryFile("w+") for _ in commands]
    procs = [
        subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for cmd, env, log in zip(commands, envs, logs, strict=True)
    ]
    timed_out = not _all_ended(procs, timeout)
    outputs = [_read(log) for log in logs]
    report = "\n".join(
        f"--- process {i} (exit {p.returncode}) ---\n{o[-6000:]}"
        for i, (p, o) in enumerate(zip(procs, outputs, strict=True))
    )
    if timed_out:
        raise AssertionError(f"timed out after {timeout} s (a hang)\n{report}")
    if any(p.returncode for p in procs):
        raise AssertionError(f"a process failed\n{report}")
    return outputs


def _all_ended(procs: list[subprocess.Popen], timeout: float) -> bool:
    """Waits `timeout` for each process in turn; on the first that outlives it, ends them all and says False.
    Their output goes to files, not pipes: a rank blocked on a full pipe that nobody reads while another is waited
    on (a chatty library's warnings) would hold every rank waiting for it in a collective."""
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            end(procs)
            return False
    return True


def _read(log) -> str:
    log.seek(0)
    text = log.read()
    log.close()
    return text


def side_by_side(commands: dict[str, list[str]], env: dict, timeout: float, cwd=None) -> dict:
    """Runs the commands at once, each in a process group of its own: name -> CompletedProcess (standard output and
    error as text). A hang kills every group and fails the test."""
    logs = {name: (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for name in commands}
    procs = {
        name: subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=logs[name][0], stderr=logs[name][1], text=True, start_new_session=True
        )
        for name, cmd in commands.items()
    }
    deadline = time.monotonic() + timeout
    try:
        for name, proc in procs.items():
            try:
                proc.wait(max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name}: no end within {timeout} s (a hang)") from None
    finally:
        end(list(procs.values()))
    return {
        name: subprocess.CompletedProcess(proc.args, proc.returncode, _read(logs[name][0]), _read(logs[name][1]))
        for name, proc in procs.items()
    }


def launch(worker: str, world_size: int, tmp_path: Path, args: dict, timeout: float = 120) -> list[dict]:
    """Runs tests/workers/<worker>.py as `world_size` ranks (torchrun's variables, gloo); each rank writes a JSON
    result to <tmp_path>/result-<rank>.json, returned in rank order."""
    port = free_port()
    (tmp_path / "args.json").write_text(json.dumps(args))
    envs = [
        environment(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
        for rank in range(world_size)
    ]
    commands = [[*warm(), str(WORKERS / f"{worker}.py"), str(tmp_path)]] * world_size
    _run(commands, envs, timeout, tmp_path)
    return [json.loads((tmp_path / f"result-{rank}.json").read_text()) for rank in range(world_size)]


def torchrun_command(script: list[str], nproc: int, restarts: int = 0, warmed: bool = False) -> list[str]:
    """`torchrun --nproc_per_node nproc <script...>` as a user types it, its own free rendezvous port; relaunched up
    to `restarts` times when a rank fails (--standalone: the c10d rendezvous, whose store can be fresh for each
    relaunch). Warmed, torchrun's agent is a fresh interpreter and its ranks the warm interpreter's children."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    command += [f"--max-restarts={restarts}", "--standalone"] if restarts else [f"--master_port={free_port()}"]
    return [*command, *(warm()[1:] if warmed else []), *script]


def torchrun(script: list[str], nproc: int, cwd: Path, timeout: float = 120, **how) -> str:
    """Runs `torchrun_command(script, nproc, **how)`; its output."""
    return _run([torchrun_command(script, nproc, **how)], [environment()], timeout, cwd)[0]
