"""Adding fivefold's rows to another package's tables once that package is imported, without importing it:
PEFT and sentence-transformers take seconds to import, which `import fivefold` does not pay."""

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds `module` as the path finder does, and calls `then` with it once it has run."""

    def __init__(self, module: str, then: Callable[[ModuleType], None]):
        self.module, self.then = module, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def run_then(module: ModuleType) -> None:
            run(module)
            self.then(module)

        spec.loader.exec_module = run_then
        return spec


def when_imported(module: str, then: Callable[[ModuleType], None]) -> None:
    """`then(module)` now if `module` is imported, else right after it is."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        then(loaded)
    elif not any(isinstance(finder, AfterImport) and finder.module == module for finder in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(module, then))
