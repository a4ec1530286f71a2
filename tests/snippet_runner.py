"""Runs the docs' python snippets one after another in one interpreter, each in a namespace of its own (its own
imports, nothing left from the snippet before), so that the pages pay for importing torch and transformers once.

Reads one JSON request per line on stdin, {"code": ..., "cwd": ...}; answers one JSON line on stdout,
{"ok": bool, "error": str}. What a snippet prints is discarded; its traceback is the error.
"""

import contextlib
import io
import json
import os
import sys
import traceback


def run(code: str, cwd: str) -> dict:
    os.chdir(cwd)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
            exec(compile(code, "<snippet>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as stop:
        if stop.code not in (None, 0):
            return {"ok": False, "error": f"{errors.getvalue()[-3000:]}\nSystemExit({stop.code!r})"}
    except BaseException:  # a snippet's failure, whatever it is, is the answer
        return {"ok": False, "error": errors.getvalue()[-3000:] + traceback.format_exc()}
    return {"ok": True, "error": ""}


def main() -> None:
    answers = sys.stdout
    sys.stdout = sys.stderr  # nothing but answers on the answer channel
    for line in sys.stdin:
        request = json.loads(line)
        answers.write(json.dumps(run(request["code"], request["cwd"])) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
