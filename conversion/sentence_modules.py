"""sentence-transformers folders: `modules.json` stacks modules (Pooling, Normalize, Dense...) on the model, each in
the folder it names. They travel with the weights, through the side-file checks, so that `SentenceTransformer` of
the converted folder embeds as the source does (a missing Normalize would change every embedding's norm)."""

import glob
import json
import re
from pathlib import Path

from .errors import ConversionError
from .side_files import copy_side_files

SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
_MODULE_PATH = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def is_sentence_transformers(folder: Path) -> bool:
    return (folder / "modules.json").is_file()


def module_folders(folder: Path) -> list[str]:
    """The folders `modules.json` names, each checked to be a plain relative path inside the checkpoint."""
    file = folder / "modules.json"
    if not file.is_file():
        return []
    try:
        modules = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ConversionError(f"{file} must hold a list of modules (objects with a path)")
    paths = []
    for module in modules:
        path = module.get("path", "")
        if not isinstance(path, str):
            raise ConversionError(f"{file}: module path {path!r} is not a string")
        if path.strip("/") in ("", "."):
            continue  # the transformer itself, at the top of the folder
        if not _MODULE_PATH.match(path) or ".." in path.split("/"):
            raise ConversionError(f"{file} names the module folder {path!r}, which is not a folder inside it")
        paths.append(path)
    return paths


def copy_sentence_transformers_files(src: Path, dst: Path) -> list[str]:
    """Copies the top-level sentence-transformers files and every module folder's files (never code)."""
    copied = copy_side_files(src, dst, SENTENCE_TRANSFORMERS_FILES)
    for path in module_folders(src):
        if (src / path).is_dir():  # Normalize, for one, saves no files: its folder may be absent
            # A module folder's own files, exactly (the side-file checks refuse folders that match a pattern).
            files = sorted(f.relative_to(src).as_posix() for f in (src / path).iterdir() if not f.is_dir())
            copied += copy_side_files(src, dst, [glob.escape(f) for f in files])
    return copied
