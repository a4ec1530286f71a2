"""Ships fivefold's modeling code inside a checkpoint as a flat folder of files, so that stock transformers
loads it with `trust_remote_code=True` where fivefold is not installed.

transformers only follows one-level relative imports (`from .x import y`) in shipped code, so each module is
copied as `<subpackage>_<module>.py` (`modeling/bert.py` -> `modeling_bert.py`) and its relative imports are
rewritten to those flat names.
"""

import ast
import functools
import importlib.util
import inspect
import re
import sys
from pathlib import Path

from fivefold.architectures import architecture_for_config

_RELATIVE_FROM = re.compile(r"^(\s*)from\s+(\.+[\w.]*)\s+import\b", re.MULTILINE)


def flat_module_name(module_name: str) -> str:
    """'fivefold.modeling.bert' -> 'modeling_bert'."""
    parts = module_name.split(".")
    if len(parts) != 3 or parts[0] != "fivefold":
        raise ValueError(f"only fivefold.<subpackage>.<module> modules can be shipped, not {module_name}")
    return f"{parts[1]}_{parts[2]}"


@functools.cache  # the same modules are walked at every save and conversion: 0.3 s of each, most of it here
def _relative_imports(module_name: str, source: str) -> tuple[str, ...]:
    package = module_name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            if not node.module:
                raise ValueError(f"{module_name}: 'from . import x' cannot be shipped; import names from a module")
            found.append(importlib.util.resolve_name("." * node.level + node.module, package))
    return tuple(found)


def shipped_modules(*classes: type) -> dict[str, str]:
    """Module name -> source, for the modules defining `classes` and everything they reach by relative import."""
    todo = [cls.__module__ for cls in classes]
    sources: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if name in sources:
            continue
        module = sys.modules.get(name) or importlib.import_module(name)
        sources[name] = inspect.getsource(module)
        todo.extend(_relative_imports(name, sources[name]))
    return sources


@functools.cache  # read from the installed metadata: the same for the life of the process
def fivefold_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fivefold")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "unknown"


def flatten_source(module_name: str, source: str) -> str:
    """The module as shipped: its relative imports flattened, under a first line naming the fivefold version and
    the file it was copied from (the model card holds each shipped file's hash)."""
    package = module_name.rpartition(".")[0]
    origin = module_name.removeprefix("fivefold.").replace(".", "/")
    header = f"# Shipped by fivefold {fivefold_version()}: a flat copy of {origin}.py\n"

    def rewrite(m: re.Match) -> str:
        dots = len(m[2]) - len(m[2].lstrip("."))
        target = importlib.util.resolve_name(m[2], package) if dots else m[2]
        return f"{m[1]}from .{flat_module_name(target)} import"

    return header + _RELATIVE_FROM.sub(rewrite, source)


def auto_map_for(config_class: type) -> dict[str, str]:
    """Every Auto class fivefold registers for this config, as `flat_module.Class` references."""
    arch = architecture_for_config(config_class)
    entries = {"AutoConfig": config_class, **arch.auto_classes}
    return {auto: f"{flat_module_name(cls.__module__)}.{cls.__name__}" for auto, cls in entries.items()}


def remote_code_bytes(config_class: type) -> int:
    """The bytes `write_remote_code` writes for `config_class` (what a conversion needs beside the weights)."""
    arch = architecture_for_config(config_class)
    sources = shipped_modules(config_class, *arch.models.values())
    return sum(len(flatten_source(name, source).encode()) for name, source in sources.items())


def write_remote_code(folder: str | Path, config_class: type) -> dict[str, str]:
    """Writes the flat code for `config_class`'s architecture into `folder`; returns the config's `auto_map`."""
    arch = architecture_for_config(config_class)
    folder = Path(folder)
    for name, source in shipped_modules(config_class, *arch.models.values()).items():
        (folder / f"{flat_module_name(name)}.py").write_text(flatten_source(name, source), encoding="utf-8")
    return auto_map_for(config_class)
