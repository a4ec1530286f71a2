"""Starting N gloo processes from a test: a free port, torchrun's environment, each process group killed when time
runs out (a hang fails the test, never CI), and every rank's output in the failure message."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(extra: dict | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(WORKERS), env.get("PYTHONPATH", "")])
    return {**env, **(extra or {})}


def _run(commands: list[list[str]], envs: list[dict], timeout: float, cwd: Path) -> list[str]:
    procs = [
        subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        for cmd, env in zip(commands, envs, strict=True)
    ]
    outputs, timed_out = [], False
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)  # each was started in a session of its own
            out, _ = proc.communicate()
        outputs.append(out)
    report = "\n".join(
        f"--- process {i} (exit {p.returncode}) ---\n{o[-6000:]}"
        for i, (p, o) in enumerate(zip(procs, outputs, strict=True))
    )
    if timed_out:
        raise AssertionError(f"timed out after {timeout} s (a hang)\n{report}")
    if any(p.returncode for p in procs):
        raise AssertionError(f"a process failed\n{report}")
    return outputs


def launch(worker: str, world_size: int, tmp_path: Path, args: dict, timeout: float = 120) -> list[dict]:
    """Runs tests/workers/<worker>.py as `world_size` ranks (torchrun's variables, gloo); each rank writes a JSON
    result to <tmp_path>/result-<rank>.json, returned in rank order."""
    port = free_port()
    (tmp_path / "args.json").write_text(json.dumps(args))
    envs = [
        _environment(
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
    commands = [[sys.executable, str(WORKERS / f"{worker}.py"), str(tmp_path)]] * world_size
    _run(commands, envs, timeout, tmp_path)
    return [json.loads((tmp_path / f"result-{rank}.json").read_text()) for rank in range(world_size)]


def torchrun(script: list[str], nproc: int, cwd: Path, timeout: float = 120) -> str:
    """`torchrun --nproc_per_node nproc <script...>` as a user types it (its own free rendezvous port)."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    command += [f"--master_port={free_port()}", *script]
    return _run([command], [_environment(None)], timeout, cwd)[0]
