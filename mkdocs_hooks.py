"""mkdocs hook: the API reference reads the sources as one `fivefold` package tree.

The package maps top-level folders onto subpackages (pyproject's package-dir: conversion/ is fivefold.conversion),
which griffe, mkdocstrings' source reader, cannot follow. Before the build this hook lays out .api-tree/fivefold
with links to the real folders, and mkdocs.yml points mkdocstrings there.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent
SUBPACKAGES = ("configuration", "conversion", "modeling")


def on_startup(**kwargs) -> None:
    package = ROOT / ".api-tree" / "fivefold"
    package.mkdir(parents=True, exist_ok=True)
    for source in [*(ROOT / "fivefold").glob("*.py"), *(ROOT / name for name in SUBPACKAGES)]:
        link = package / source.name
        if not link.is_symlink():
            link.symlink_to(source)
