"""A warm `fivefold` command for the docs' shell snippets: one server imports fivefold once and forks a child for
each call, so that a page's CLI calls skip the start-up (`import fivefold` is 6-12 s on the 2-core machines, most of
a docs snippet's time).

`python warm_cli.py serve SOCKET` is the server; `python warm_cli.py call SOCKET ARGS...` (the `fivefold` on the
snippets' PATH) sends its arguments, working folder, environment and standard streams (as file descriptors) and exits
with the child's exit code. A call whose environment differs from the server's in anything but the shell's own
variables runs the real `fivefold` instead: the server's imports read the environment once, so a variable the
snippet sets could be missed. When the caller dies (the test's timeout kills its process group), its child exits."""

import json
import os
import signal
import socket
import sys
import threading

SHELL_VARIABLES = {"PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PS4", "IFS", "OPTIND"}


def same_environment(a: dict, b: dict) -> bool:
    def keep(env: dict) -> dict:
        return {k: v for k, v in env.items() if k not in SHELL_VARIABLES}

    return keep(a) == keep(b)


def serve(path: str) -> None:
    environment = dict(os.environ)  # before the imports, some of which set variables of their own
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)  # calls made during the imports wait in the backlog
    from fivefold import cli  # the start-up every call would pay

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        connection, _ = server.accept()
        if os.fork() == 0:
            server.close()
            os._exit(run_call(connection, cli.main, environment))
        connection.close()


def run_call(connection: socket.socket, main, environment: dict) -> int:
    message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    request = json.loads(message)
    if not same_environment(request["env"], environment):
        connection.sendall(b"cold")
        return 0
    connection.sendall(b"warm")
    for fd, target in zip(fds, (0, 1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.update(request["env"])  # the shell's own variables; the rest is equal
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)

    def exit_with_the_caller() -> None:
        if not connection.recv(1):  # the caller closed the connection: it died
            os._exit(137)

    threading.Thread(target=exit_with_the_caller, daemon=True).start()
    sys.argv = ["fivefold", *request["argv"]]
    try:
        code = main(request["argv"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    connection.sendall(bytes([code or 0]))
    return code or 0


def call(path: str, argv: list[str], real: str) -> int:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:  # no server (it failed to start, or was stopped)
        os.execv(real, [real, *argv])
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(connection, [request], [0, 1, 2])
    if connection.recv(4) == b"cold":
        os.execv(real, [real, *argv])
    code = connection.recv(1)
    return code[0] if code else 1  # no code: the child died


if __name__ == "__main__":
    _, role, socket_path, *rest = sys.argv
    if role == "serve":
        serve(socket_path)
    else:
        real_command, *arguments = rest
        sys.exit(call(socket_path, arguments, real_command))
