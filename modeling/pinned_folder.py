"""Loading a folder that another process may replace meanwhile: `fivefold convert --force` and `save_pretrained`
swap a folder in whole, and a load that opened shard 1 of the old folder and shard 2 of the new one would hold a
model that neither wrote, silently. A load reads every file through one open handle of the folder (Linux's
`/proc/self/fd/N`), so it sees one folder throughout; if that folder was replaced and removed before the load had
opened all its files, the load fails on a missing file, and `from_pretrained` loads again from the path: the new
folder, whole. Costs one open file descriptor while loading.
"""

import contextvars
import dataclasses
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from transformers import PreTrainedModel

_FDS = "/proc/self/fd"
# The folder each pinned handle stands for, while it is pinned.
_GIVEN: dict[str, str] = {}
# The folder of the stock checkpoint being converted in memory in this thread, if any.
_IN_MEMORY_FROM: contextvars.ContextVar[str | None] = contextvars.ContextVar("fivefold_in_memory_from", default=None)


@contextmanager
def pinned_folder(path: str | os.PathLike | None) -> Iterator[str | os.PathLike | None]:
    """A path naming the same folder as `path` until the block ends, whatever is renamed onto `path` meanwhile;
    `path` itself where it is not a local folder or the system has no `/proc/self/fd`."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path) or not os.path.isdir(_FDS):
        yield path
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    pinned = f"{_FDS}/{fd}"
    _GIVEN[pinned] = os.fspath(path)
    try:
        yield pinned
    finally:
        _GIVEN.pop(pinned, None)
        os.close(fd)


@contextmanager
def loading_from(folder: str | os.PathLike) -> Iterator[None]:
    """Around a load that hands transformers no folder (a stock checkpoint converted in memory): the folder its
    report names."""
    token = _IN_MEMORY_FROM.set(os.fspath(folder))
    try:
        yield
    finally:
        _IN_MEMORY_FROM.reset(token)


def as_given(path: str | os.PathLike | None) -> str | os.PathLike | None:
    """The folder a user named for a pinned handle's path, while it is pinned (for no path, the folder of the
    conversion in memory under way); any other path as it is."""
    path = _IN_MEMORY_FROM.get() if path is None else path
    return _GIVEN.get(os.fspath(path), path) if isinstance(path, (str, os.PathLike)) else path


class ReportsTheFolderGiven:
    """transformers' loading report (`LOAD REPORT from: ...`) names the folder the user gave, not its handle."""

    @staticmethod
    def _finalize_model_loading(model, load_config, loading_info):
        given = as_given(load_config.pretrained_model_name_or_path)
        load_config = dataclasses.replace(load_config, pretrained_model_name_or_path=given)
        return PreTrainedModel._finalize_model_loading(model, load_config, loading_info)


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
