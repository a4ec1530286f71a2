"""Side files: the tokenizer and processor files that travel with the weights, never code."""

import json
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path

from .errors import CheckpointWarning, ConversionError
from .reader import allowed_roots, inside

# Files that travel with the weights: tokenizers, processors, vocabularies.
SIDE_FILE_PATTERNS = (
    "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model",
    "preprocessor_config.json", "image_processor*.json", "processor_config.json", "chat_template*",
)  # fmt: skip


# Code never travels: the only code in a fivefold checkpoint is fivefold's own (see remote_code.py).
_NOT_SIDE_FILES = (".py", ".pyc", ".so", ".pyd", ".dll", ".dylib", ".sh", ".exe")


def copy_side_files(src: Path, dst: Path, patterns: Iterable[str] = SIDE_FILE_PATTERNS) -> list[str]:
    """Copies tokenizer and processor files, never code. A JSON side file's `auto_map` (which would make
    `trust_remote_code=True` run code from elsewhere) is dropped with a warning; a file that is a symlink leading
    out of the checkpoint folder is refused."""
    copied = []
    roots = allowed_roots(src)
    for pattern in patterns:
        for path in sorted(src.glob(pattern)):
            name = path.relative_to(src).as_posix()  # a pattern may reach into a subfolder: kept as it is
            if not path.is_file() or path.suffix.lower() in _NOT_SIDE_FILES or (dst / name).exists():
                continue
            if not inside(path, roots):
                raise ConversionError(f"{name} in {src} is a link to {path.resolve()}, outside the folder")
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst / name, follow_symlinks=True)
            _drop_auto_map(dst / name)
            copied.append(name)
    return copied


def _drop_auto_map(path: Path) -> None:
    if path.suffix != ".json":
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # not ours to judge: the tokenizer will say
    if isinstance(data, dict) and "auto_map" in data:
        warnings.warn(
            f"dropped auto_map {data.pop('auto_map')!r} from {path.name}: fivefold checkpoints ship only "
            "fivefold's own code",
            CheckpointWarning,
            stacklevel=3,
        )
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
