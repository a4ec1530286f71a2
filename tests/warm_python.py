"""A warm Python for the docs' shell snippets: one server imports torch, transformers and fivefold once and forks a
child for each call, so that a page's `fivefold` calls skip the start-up (`import fivefold` is 6-12 s on the 2-core
machines: most of a CLI call's time; convert.md, vit.md and llama.md, twice each, took 269 s, 37 s so).

`python warm_python.py serve SOCKET` is the server; `python warm_python.py call SOCKET ARGS...` runs `python ARGS...`
(`-m MODULE ...` or `SCRIPT ...`) in a child of the server with the caller's working folder, environment and standard
streams (passed as file descriptors), and exits with the child's exit code. A call whose environment differs from
the server's in more than the shell's variables and PYTHONPATH runs a real interpreter
instead: the imports read the environment once (OpenMP its thread count, huggingface_hub its offline flag), so a
variable set later could be missed. The server never computes, so its children fork with no thread pool started.
When the caller dies (a test's timeout kills its process group), its child exits."""

import atexit
import json
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback

MAY_DIFFER = {
    *("PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PS4", "IFS", "OPTIND"),  # the shell's own
    "PYTHONPATH",  # applied to sys.path in the child
}
PRELOAD = ("torch", "transformers", "fivefold", "fivefold.cli")


def start(env: dict) -> list[str]:
    """Starts a server with this environment (stopped when this process exits); returns the command prefix that
    runs `python ...` through it: `[*start(env), "-m", "fivefold", "demo"]`."""
    path = os.path.join(tempfile.mkdtemp(prefix="warm-python-"), "socket")
    server = subprocess.Popen(
        [sys.executable, __file__, "serve", path],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    atexit.register(stop, server, path)
    return [sys.executable, __file__, "call", path]


def stop(server: subprocess.Popen, path: str) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def warm_enough(asked: dict, server: dict) -> bool:
    def fixed(env: dict) -> dict:
        return {k: v for k, v in env.items() if k not in MAY_DIFFER}

    return fixed(asked) == fixed(server)


def serve(path: str) -> None:
    environment = dict(os.environ)  # before the imports, some of which set variables of their own
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)  # calls made during the imports wait in the backlog
    for module in PRELOAD:
        __import__(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        connection, _ = server.accept()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os._exit(run_call(connection, environment))
        connection.close()


def run_call(connection: socket.socket, environment: dict) -> int:
    message, fds, _, _ = socket.recv_fds(connection, 1 << 22, 3)
    request = json.loads(message)
    if not warm_enough(request["env"], environment):
        connection.sendall(b"cold")
        return 0
    connection.sendall(b"warm")
    for fd, target in zip(fds, (0, 1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.update(request["env"])
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    threading.Thread(target=exit_with_the_caller, args=(connection,), daemon=True).start()
    code = run_python(request["argv"], extra)
    atexit._run_exitfuncs()  # what a real interpreter runs on its way out
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    connection.sendall(bytes([code]))
    return code


def exit_with_the_caller(connection: socket.socket) -> None:
    if not connection.recv(1):  # the caller closed its end: it died
        os._exit(137)


def run_python(argv: list[str], path: list[str]) -> int:
    """`python ARGV` in this process: its exit code as the interpreter would give it."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:0] = ["", *path]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
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


def call(path: str, argv: list[str]) -> int:
    cold = [sys.executable, *argv]
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:  # no server (it failed to start, or was stopped)
        os.execv(sys.executable, cold)
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(connection, [request], [0, 1, 2])
    if connection.recv(4) != b"warm":
        os.execv(sys.executable, cold)
    code = connection.recv(1)
    return code[0] if code else 1  # no code: the child died


if __name__ == "__main__":
    role, socket_path, *arguments = sys.argv[1:]
    if role == "serve":
        serve(socket_path)
    else:
        sys.exit(call(socket_path, arguments))
