"""Side files: the tokenizer, processor and generation files that travel with the weights, never code."""

import json
import stat
import warnings
from collections.abc import Iterable
from pathlib import Path

from transformers import GenerationConfig

from .errors import CheckpointWarning, ConversionError
from .limits import parse_json, read_regular_file
from .reader import allowed_roots, inside

# Files that travel with the weights: tokenizers, processors, vocabularies, generation defaults.
SIDE_FILE_PATTERNS = (
    "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model",
    "preprocessor_config.json", "image_processor*.json", "processor_config.json", "chat_template*",
    "additional_chat_templates/*",
    "generation_config.json",
)  # fmt: skip
MAX_SIDE_FILE_BYTES = 2**31  # a SentencePiece model or tokenizer.json is tens of MB; nothing real is near this


# Code never travels: the only code in a fivefold checkpoint is fivefold's own (see remote_code.py).
_NOT_SIDE_FILES = (".py", ".pyc", ".so", ".pyd", ".dll", ".dylib", ".sh", ".exe")


def copy_side_files(src: Path, dst: Path, patterns: Iterable[str] = SIDE_FILE_PATTERNS) -> list[str]:
    """Copies tokenizer, processor and generation files, never code. A JSON side file's `auto_map` (which would
    make `trust_remote_code=True` run code from elsewhere) is dropped with a warning; a side file that is a
    symlink leading out of the checkpoint folder, or not a regular file (a FIFO, a folder, a device), is refused."""
    copied = []
    roots = allowed_roots(src)
    for pattern in patterns:
        for path in sorted(src.glob(pattern)):
            name = path.relative_to(src).as_posix()  # a pattern may reach into a subfolder: kept as it is
            if path.suffix.lower() in _NOT_SIDE_FILES or (dst / name).exists():
                continue
            if not inside(path, roots):
                raise ConversionError(f"{name} in {src} is a link to {path.resolve()}, outside the folder")
            data = read_regular_file(path, MAX_SIDE_FILE_BYTES)  # refuses FIFOs, folders and devices, one line
            if path.suffix == ".json":
                data = _without_auto_map(data, path)
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            (dst / name).write_bytes(data)
            copied.append(name)
            _keep_mode(path, dst / name)
    return copied


# What a generation config takes from the model's config anyway (its token ids and use_cache), and metadata.
_GIVEN_BY_THE_MODEL_CONFIG = {
    "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "use_cache", "transformers_version",
    "_from_model_config",
}  # fmt: skip


def generation_config_of(folder: Path, stock: dict, model_class: type) -> GenerationConfig | None:
    """The generation defaults transformers reads beside the checkpoint it loads into a model that generates: its
    generation_config.json, else (no such file, or one transformers cannot read) the generation fields of an older
    config.json (max_length, num_beams, ...: transformers' fallback). None for a model that does not generate, and
    where neither holds more than the model's config gives."""
    if not model_class.can_generate():
        return None  # transformers reads no generation file for it
    try:
        return GenerationConfig.from_pretrained(folder)
    except OSError:
        legacy = GenerationConfig.from_model_config(dict(stock))
    return legacy if set(legacy.to_diff_dict()) - _GIVEN_BY_THE_MODEL_CONFIG else None


def write_legacy_generation_config(src: Path, stock: dict, model_class: type, dst: Path) -> None:
    """A converted config.json holds the model's fields only: the generation fields of an older config.json (with
    no generation_config.json, which copy_side_files copies) go to dst's generation_config.json for a model that
    generates, where transformers reads them from a folder like any other."""
    if (src / "generation_config.json").exists() or (dst / "generation_config.json").exists():
        return
    if (generation := generation_config_of(src, stock, model_class)) is not None:
        generation.save_pretrained(dst)


def _keep_mode(src: Path, dst: Path) -> None:
    dst.chmod(stat.S_IMODE(src.stat().st_mode))


def _without_auto_map(data: bytes, path: Path) -> bytes:
    parsed = parse_json(data, path, max_depth=None)  # only its top level is read
    if not isinstance(parsed, dict) or "auto_map" not in parsed:
        return data
    warnings.warn(
        f"dropped auto_map {parsed.pop('auto_map')!r} from {path.name}: fivefold checkpoints ship only "
        "fivefold's own code",
        CheckpointWarning,
        stacklevel=4,
    )
    return (json.dumps(parsed, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
