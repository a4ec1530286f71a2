"""`save_pretrained` made atomic: the model is saved into a temporary folder beside the target, which then takes
the target's place in one step (the writer's atomic folder), carrying over the target's other entries."""

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .writer import atomic_folder, holds_working_directory

# What transformers' save_pretrained writes or deletes as stale in a folder it saves into; everything else there
# (a tokenizer saved first, a trainer's files, subfolders) it leaves alone.
_WEIGHT_FILE = re.compile(r"^(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?$")


@contextmanager
def updated_folder(dst: str | os.PathLike, needed: int | None = None) -> Iterator[Path]:
    """`save_pretrained` made atomic: yields a temporary folder beside `dst` to save into, which then takes
    `dst`'s place in one step, carrying over (hard-linked) every entry of the old `dst` that the save did not
    write and that transformers would not have deleted. Killed at any instant, `dst` is the old folder or the
    new one. A symlink `dst` is followed: the folder it names is updated. The working directory, or a folder
    holding it, is written in place. `needed`: the bytes the save writes at least (refused at once where the
    file system says they do not fit)."""
    dst = Path(dst).resolve() if Path(dst).is_symlink() else Path(os.path.abspath(dst))
    if holds_working_directory(dst):
        # Swapping the working directory (or a folder above it) would leave the process in a deleted folder:
        # written in place, as transformers does.
        yield dst
        return
    with atomic_folder(dst, force=True, needed=needed) as tmp:
        yield tmp
        if dst.is_dir():
            for entry in dst.iterdir():
                if not (tmp / entry.name).exists() and not (tmp / entry.name).is_symlink():
                    if not _WEIGHT_FILE.match(entry.name):
                        _link_into(entry, tmp / entry.name)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _link_into(entry: Path, target: Path) -> None:
    if entry.is_symlink():
        os.symlink(os.readlink(entry), target)
    elif entry.is_dir():
        shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(entry), str(target))
