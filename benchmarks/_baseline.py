"""Another tree's `gym_concurrency` in this process, for before / after figures in one run.

`load(path)` imports the package of the checkout at `path` (e.g. `git worktree add /tmp/before
<commit>`) as `gym_concurrency_baseline`: the library imports itself only relatively, so both
trees live side by side, each with its own registry and globals.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["NAME", "load"]

NAME = "gym_concurrency_baseline"


def load(tree: Path) -> ModuleType:
    """The `gym_concurrency` package of the checkout at `tree`, imported as NAME."""
    if NAME in sys.modules:
        return sys.modules[NAME]
    package = tree.resolve() / "gym_concurrency"
    spec = importlib.util.spec_from_file_location(
        NAME, package / "__init__.py", submodule_search_locations=[str(package)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"no gym_concurrency package at {tree}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    spec.loader.exec_module(module)
    return module
