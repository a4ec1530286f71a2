"""A warm Python for the docs' shell snippets and the multi-process tests (tests/launching.py): one server imports
torch, transformers and fivefold once and forks a child for each call, so that a page's `fivefold` calls and a
test's ranks skip the start-up (`import fivefold` is 6-12 s on the 2-core machines: most of a CLI call's time;
convert.md, vit.md and llama.md, twice each, took 269 s, 37 s so).

`python warm_python.py serve SOCKET [MODULE ...]` is the server (it imports the modules, by default PRELOAD);
`python warm_python.py call SOCKET ARGS...` runs `python ARGS...` (`-m MODULE ...`, `-c CODE ...` or `SCRIPT ...`) in a
child of the server with the caller's working folder, environment and standard streams (passed as file
descriptors), and ends as the child ends: with its exit code, or killed by the same signal (so that a launcher such
as torchrun sees `Signal 9 (SIGKILL)` when a rank killed itself). A signal that would end the caller (SIGTERM,
SIGINT, SIGHUP, SIGQUIT: torchrun stopping its workers) is passed on to the child first. A call whose environment
differs from the server's (before its imports; the variables its imports added may be there, with their values)
in more than the shell's variables, PYTHONPATH and the variables a launcher gives each rank (RANK, MASTER_PORT,
TORCHELASTIC_*, ...) runs a real interpreter instead: the imports read the environment once (OpenMP its thread
count, huggingface_hub its offline flag), so a variable set later could be missed. So does a call with
interpreter options (`-u`, `-X ...`), and one from a memory cgroup the child cannot join: the child runs in the
caller's, as a process the caller started would (what the server's imports hold stays charged to the server's;
a benchmark's limit applies to what the child adds). The server
never computes, so its children fork with no thread pool started, and its objects are frozen out of the garbage
collector, so that a child's collections do not copy the pages they sit on. When the caller dies (a test's timeout
kills its process group), its child is killed. Linux 5.3 or later (a pidfd watches the child)."""

import atexit
import gc
import importlib
import json
import os
import runpy
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

MAY_DIFFER = {
    *("PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PS4", "IFS", "OPTIND"),  # the shell's own
    "PYTHONPATH",  # applied to sys.path in the child
    # What a launcher gives each rank (torchrun, tests/launching.py): read when the process group starts.
    *("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    *("GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",  # read by torchrun's agent for its rendezvous, never by a rank's imports
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",  # an address in a process that compiled, for the code it compiled
}
MAY_DIFFER_PREFIXES = ("TORCHELASTIC_",)  # torchrun's restart count, run id, error file
PRELOAD = ("torch", "transformers", "fivefold", "fivefold.cli")
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_SERVERS: dict[str, subprocess.Popen] = {}  # by socket path


def start(env: dict, preload: tuple[str, ...] = PRELOAD) -> list[str]:
    """Starts a server with this environment that imports `preload` (stopped when this process exits); returns the
    command prefix that runs `python ...` through it: `[*start(env), "-m", "fivefold", "demo"]`."""
    path = os.path.join(tempfile.mkdtemp(prefix="warm-python-"), "socket")
    server = subprocess.Popen(
        [sys.executable, __file__, "serve", path, *preload],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    atexit.register(stop, server, path)
    _SERVERS[path] = server
    while not os.path.exists(path) and server.poll() is None:  # bound at once; the calls then wait for the imports
        time.sleep(0.01)
    return [sys.executable, __file__, "call", path]


# `torchrun` through a server: torch's own launcher in a plain interpreter (it imports torch alone), its ranks
# children of the server (the training script goes after the call prefix).
TORCHRUN = """#!{python}
import sys
from torch.distributed.run import get_args_parser, main
argv = sys.argv[1:]
parsed = get_args_parser().parse_args(argv)
if parsed.module or parsed.no_python:  # not a script torchrun runs with python: as given
    main(argv)
else:
    at = len(argv) - len(parsed.training_script_args) - 1
    main([*argv[:at], *{warm}, *argv[at:]])
"""


def write_shims(folder: str, prefix: list[str], names: tuple[str, ...] = ("fivefold", "torchrun")) -> None:
    """Executables in `folder` that run through the server of `prefix`: `fivefold`, `torchrun` (its ranks too) and
    `python` (`python -m torch.distributed.run` as that `torchrun`)."""
    quoted = " ".join(shlex.quote(part) for part in prefix)
    torchrun = shlex.quote(os.path.join(folder, "torchrun"))
    shims = {
        "fivefold": f'#!/bin/sh\nexec {quoted} -m fivefold "$@"\n',
        "torchrun": TORCHRUN.format(python=sys.executable, warm=prefix[1:]),
        "python": (
            f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = torch.distributed.run ]; then shift 2; exec {torchrun} "$@"; fi\n'
            f'exec {quoted} "$@"\n'
        ),
    }
    for name in {*names, *(("torchrun",) if "python" in names else ())}:
        path = os.path.join(folder, name)
        with open(path, "w") as file:
            file.write(shims[name])
        os.chmod(path, 0o755)


def close(prefix: list[str]) -> None:
    """Stops the server `start` returned this prefix for, before this process exits."""
    stop(_SERVERS.pop(prefix[-1]), prefix[-1])


def stop(server: subprocess.Popen, path: str) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)  # the server, its keepers and their children: one process group
        server.wait()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def warm_enough(asked: dict, server: dict, added: dict) -> bool:
    """Whether `asked` is the server's environment `server` (before its imports), up to the variables that may
    differ and those the imports `added`, with the values they set."""

    def fixed(env: dict) -> dict:
        return {
            k: v
            for k, v in env.items()
            if k not in MAY_DIFFER and not k.startswith(MAY_DIFFER_PREFIXES) and not (k in added and added[k] == v)
        }

    return fixed(asked) == fixed(server)


def _memory_cgroup(membership: str) -> str:
    """The folder of the memory cgroup that a /proc/PID/cgroup text names (v1's memory controller, else v2's)."""
    unified = ""
    for line in membership.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return f"/sys/fs/cgroup/memory{path}"
        if not controllers:
            unified = f"/sys/fs/cgroup{path}"
    return unified


def _move_to(cgroup: str) -> bool:
    """Moves this process into the cgroup folder; whether it could."""
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    except OSError:
        return False
    return True


def serve(path: str, preload: list[str]) -> None:
    environment = dict(os.environ)  # before the imports
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)  # calls made during the imports wait in the backlog
    for module in preload:
        importlib.import_module(module)
    # A caller that made the same imports holds the variables they add (TORCHINDUCTOR_CACHE_DIR here).
    added = {k: v for k, v in os.environ.items() if k not in environment}
    gc.freeze()  # what the imports made is never collected: a child's collections leave its pages shared
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers are reaped by the kernel
    while True:
        connection, _ = server.accept()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os._exit(keep(connection, environment, added))
        connection.close()


def keep(connection: socket.socket, environment: dict, added: dict) -> int:
    """One call: forks the child that runs it, sends the caller the child's pid, then how the child ended (its wait
    status); kills the child if the caller goes first."""
    message, fds, _, _ = socket.recv_fds(connection, 1 << 22, 3)
    request = json.loads(message)
    # The child starts in the caller's memory cgroup: this keeper joins it before the fork and leaves it after (the
    # caller may remove the cgroup as soon as the child has ended).
    with open("/proc/self/cgroup") as membership:
        own = _memory_cgroup(membership.read())
    theirs = _memory_cgroup(request["cgroup"])
    if not warm_enough(request["env"], environment, added) or (theirs != own and not _move_to(theirs)):
        connection.sendall(b"cold")
        return 0
    child = os.fork()
    if child == 0:
        connection.close()
        os._exit(run_call(request, fds))
    if theirs != own:
        _move_to(own)
    for fd in fds:
        os.close(fd)
    connection.sendall(b"warm" + struct.pack("!i", child))
    status = wait_unless_abandoned(child, connection)
    try:
        connection.sendall(struct.pack("!i", status))
    except OSError:
        pass  # the caller is gone
    return 0


def wait_unless_abandoned(child: int, connection: socket.socket) -> int:
    """The child's wait status; if the caller hangs up first (it died), the child is killed."""
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(connection, select.POLLIN)
    while not any(fd == pidfd for fd, _ in poller.poll()):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # the caller never writes after its request: it died
        poller.unregister(connection)
    os.close(pidfd)
    return os.waitpid(child, 0)[1]


def run_call(request: dict, fds: list[int]) -> int:
    for fd, target in zip(fds, (0, 1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.update(request["env"])
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    code = run_python(request["argv"], extra)
    atexit._run_exitfuncs()  # what a real interpreter runs on its way out
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code


def run_python(argv: list[str], path: list[str]) -> int:
    """`python ARGV` in this process: its exit code as the interpreter would give it."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:0] = ["", *path]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[:0] = ["", *path]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path[:0] = [os.path.dirname(os.path.abspath(argv[0])), *path]
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return (stop.code or 0) & 0xFF
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size and (part := connection.recv(size - len(data))):
        data += part
    return data


def call(path: str, argv: list[str]) -> int:
    cold = [sys.executable, *argv]
    if argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c"):  # interpreter options: a real interpreter's
        os.execv(sys.executable, cold)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:  # no server (it failed to start, or was stopped)
        os.execv(sys.executable, cold)
    with open("/proc/self/cgroup") as membership:
        cgroup = membership.read()
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "cgroup": cgroup}).encode()
    socket.send_fds(connection, [request], [0, 1, 2])
    answer = _receive(connection, 8)
    if answer[:4] != b"warm":
        os.execv(sys.executable, cold)
    child = struct.unpack("!i", answer[4:])[0]
    for signum in PASSED_ON:
        signal.signal(signum, lambda signum, frame: os.kill(child, signum))
    status = _receive(connection, 4)
    if not status:
        return 1  # the keeper died
    code = os.waitstatus_to_exitcode(struct.unpack("!i", status)[0])
    if code < 0:  # killed by a signal: end the same way
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    role, socket_path, *arguments = sys.argv[1:]
    if role == "serve":
        serve(socket_path, arguments or list(PRELOAD))
    else:
        sys.exit(call(socket_path, arguments))
