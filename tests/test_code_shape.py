"""The shape of the code, checked: no import cycle anywhere in the package (every import statement counts, at
module level or inside a function), architecture files under modeling/ at most 200 lines, no source module past
350, and one shape-letter legend used the same way in every modeling file."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from fivefold.architectures import NAMES

ROOT = Path(__file__).resolve().parents[1]
# Folder -> the package it is (pyproject.toml's package-dir).
PACKAGES = {
    "fivefold": "fivefold",
    "configuration": "fivefold.configuration",
    "modeling": "fivefold.modeling",
    "conversion": "fivefold.conversion",
}


def package_modules() -> dict[str, Path]:
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules one module imports, by any import statement in it. A package's own __init__ running
    before its submodules is Python's doing, not an import of the module's."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (
                importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                if node.level
                else node.module
            )
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from pkg import module`
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    graph = {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}
    # The table imports each architecture's key-map module by name (importlib), which the parser cannot see.
    graph["fivefold.architectures"] |= {f"fivefold.conversion.{name}" for name in NAMES}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_walker_reads_imports_inside_functions(tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    known = {"pkg.a", "pkg.b"}
    graph = {f"pkg.{n}": imported_modules(f"pkg.{n}", tmp_path / f"{n}.py", known) for n in "ab"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]


@pytest.mark.parametrize("name", NAMES)
def test_architecture_files_are_small(name):
    lines = len((ROOT / "modeling" / f"{name}.py").read_text(encoding="utf-8").splitlines())
    assert lines <= 200, f"modeling/{name}.py has {lines} lines: something shared is hiding in it"


def test_no_source_module_past_350_lines():
    long = {}
    for path in [*package_modules().values(), *(ROOT / "benchmarks").glob("*.py")]:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > 350:
            long[str(path.relative_to(ROOT))] = lines
    assert not long, long


def legend() -> dict[str, str]:
    """The shape letters of fivefold.modeling's docstring: `X meaning` per line of its legend."""
    text = (ROOT / "modeling" / "__init__.py").read_text(encoding="utf-8")
    block = text.split("Shape letters", 1)[1].split('"""', 1)[0]
    return dict(re.findall(r"^- (\S+) ([^(\n]+?)(?: \(.*\))?$", block, re.MULTILINE))


def shapes_lines(path: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = doc.split("Shapes:", 1)[1].split("\n\n", 1)[0] if "Shapes:" in doc else ""
    items = re.split(r",(?![^()]*\))", " ".join(paragraph.split()))  # commas outside parentheses
    return [item.strip().rstrip(".") for item in items if item.strip()]


def test_every_modeling_file_uses_the_one_legend():
    letters = legend()
    assert {"B", "T", "S", "P", "C", "H", "K", "D", "N", "E", "R", "M"} <= set(letters)
    for path in sorted(set((ROOT / "modeling").glob("*.py")) - {ROOT / "modeling" / "__init__.py"}):
        for item in shapes_lines(path):
            letter, _, meaning = item.partition(" ")
            meaning = re.sub(r" \(.*\)$", "", meaning)
            assert letter in letters, f"{path.name}: shape letter {letter} is not in fivefold.modeling's legend"
            assert meaning == letters[letter], f"{path.name}: {letter} means {letters[letter]!r}, not {meaning!r}"
