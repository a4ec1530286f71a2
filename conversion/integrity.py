"""What a converted folder holds is what the conversion wrote: the model card lists the sha256 of every file beside
it (weight shards, shipped code, config, tokenizer), and `fivefold verify --integrity` checks the folder against
that list, so that a corrupted or altered copy is found before it is used."""

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .errors import ConversionError

CARD = "README.md"
_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def folder_hashes(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every regular file under `folder`, the model card aside (it holds the list)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return {p.relative_to(folder).as_posix(): sha256_of(p) for p in files if p.relative_to(folder).as_posix() != CARD}


@dataclass(frozen=True)
class Finding:
    """One file that is not what the card says: `problem` is 'corrupted', 'missing' or 'not in the card'."""

    name: str
    problem: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.problem}" + (f" ({self.detail})" if self.detail else "")


def recorded_hashes(folder: Path) -> tuple[str, dict[str, str]]:
    """(the fivefold version that wrote the folder, {file: sha256}) from its model card."""
    from huggingface_hub.repocard import metadata_load

    card = folder / CARD
    if not card.is_file():
        raise ConversionError(f"{folder} has no {CARD}: nothing records what its files should hold")
    try:
        recorded = (metadata_load(card) or {}).get("fivefold") or {}
    except Exception as e:
        raise ConversionError(f"{card} has no readable metadata: {' '.join(str(e).split())}") from None
    hashes = recorded.get("sha256") if isinstance(recorded, dict) else None
    if not isinstance(hashes, dict) or not hashes:
        raise ConversionError(f"{card} lists no file hashes (fivefold.sha256): convert the folder again to add them")
    return str(recorded.get("version", "unknown")), {str(k): str(v) for k, v in hashes.items()}


def check_folder(folder: str | Path) -> tuple[dict[str, str], list[Finding]]:
    """Every file the card lists, hashed again: (the recorded hashes, what differs). A weight or code file the card
    does not list is a finding too: it would be loaded or run."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConversionError(f"{folder} is not a folder")
    _, recorded = recorded_hashes(folder)
    findings = []
    for name, expected in recorded.items():
        path = folder / name
        if not path.is_file():
            findings.append(Finding(name, "missing"))
        elif (got := sha256_of(path)) != expected:
            size = path.stat().st_size
            findings.append(Finding(name, "corrupted", f"sha256 {got[:12]}..., the card says {expected[:12]}...; "
                                                       f"{size} bytes"))  # fmt: skip
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.suffix in (".safetensors", ".bin", ".py", ".json") and name not in recorded and name != CARD:
            findings.append(Finding(name, "not in the card", "a file the conversion did not write"))
    return recorded, findings
