"""Loading a folder that another process may replace meanwhile: `fivefold convert --force` and `save_pretrained`
swap a folder in whole, and a load that opened shard 1 of the old folder and shard 2 of the new one would hold a
model that neither wrote, silently. A load reads every file through one open handle of the folder (Linux's
`/proc/self/fd/N`), so it sees one folder throughout; if that folder was replaced and removed before the load had
opened all its files, the load fails on a missing file, and `from_pretrained` loads again from the path: the new
folder, whole. Costs one open file descriptor while loading.
"""

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

_FDS = "/proc/self/fd"


@contextmanager
def pinned_folder(path: str | os.PathLike | None) -> Iterator[str | os.PathLike | None]:
    """A path naming the same folder as `path` until the block ends, whatever is renamed onto `path` meanwhile;
    `path` itself where it is not a local folder or the system has no `/proc/self/fd`."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path) or not os.path.isdir(_FDS):
        yield path
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"{_FDS}/{fd}"
    finally:
        os.close(fd)


def replaced(path: str | os.PathLike, pinned: str | os.PathLike) -> bool:
    """Whether `path` now names another folder than the one `pinned_folder` held."""
    if os.fspath(pinned) == os.fspath(path):
        return False
    try:
        now, held = os.stat(path), os.stat(pinned)
    except OSError:
        return True
    return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)


def named_as_given(error: BaseException, pinned: str | os.PathLike, path: str | os.PathLike) -> BaseException:
    """`error` with the pinned handle's path (`/proc/self/fd/N/...`) in its message turned back into `path`, the
    folder the user named (a missing shard, a missing variant); the same exception object, to raise."""
    held, given = os.fspath(pinned), os.fspath(path)
    if held == given:
        return error

    held_path = re.compile(re.escape(held) + r"(?!\d)")  # /proc/self/fd/3, not /proc/self/fd/30

    def told(value: object) -> object:
        return held_path.sub(lambda _: given, value) if isinstance(value, str) else value

    error.args = tuple(told(a) for a in error.args)
    for field in ("filename", "filename2"):  # an OSError's message is built from these where they are set
        if isinstance(error, OSError) and getattr(error, field) is not None:
            setattr(error, field, told(getattr(error, field)))
    return error
