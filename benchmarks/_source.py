"""Import gym_concurrency (and gym_concurrency.middleware) from a chosen source tree.

The venv's editable install maps `gym_concurrency` to <project>/gym_concurrency and
`gym_concurrency.middleware` to <project>/middleware. To measure another checkout (a git
worktree of an older commit, say) without reinstalling, `use_source_tree(root)` puts a finder
in front of every other one that maps both packages into `root`; their submodules then load
from the same tree through the packages' `__path__`. `loaded_files()` says where every loaded
gym_concurrency module came from, so a run can prove that nothing mixed in.

Call it before anything imports gym_concurrency.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["PROJECT_ROOT", "describe_tree", "loaded_files", "use_source_tree"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = {"gym_concurrency": "gym_concurrency", "gym_concurrency.middleware": "middleware"}


class _TreeFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        folder = _PACKAGES.get(fullname)
        if folder is None:
            return None
        package = self.root / folder
        return importlib.util.spec_from_file_location(
            fullname, package / "__init__.py", submodule_search_locations=[str(package)]
        )


def use_source_tree(root: str | Path) -> Path:
    """Make `import gym_concurrency[.middleware]` load from `root`; returns the resolved root."""
    resolved = Path(root).resolve()
    for folder in _PACKAGES.values():
        if not (resolved / folder / "__init__.py").is_file():
            raise SystemExit(f"{resolved} is not a gym-concurrency source tree (no {folder}/)")
    already = [name for name in sys.modules if name.split(".")[0] == "gym_concurrency"]
    if already:
        raise RuntimeError(f"use_source_tree() must run before importing {already[0]}")
    sys.meta_path.insert(0, _TreeFinder(resolved))
    return resolved


def loaded_files(root: Path | None = None) -> dict[str, str]:
    """Every loaded gym_concurrency module and its file; with `root`, fail if any is outside."""
    files = {
        name: str(getattr(module, "__file__", None))
        for name, module in sorted(sys.modules.items())
        if name.split(".")[0] == "gym_concurrency"
    }
    if root is not None:
        outside = {n: f for n, f in files.items() if not f.startswith(str(root) + "/")}
        if outside:
            raise RuntimeError(f"modules loaded from outside {root}: {outside}")
    return files


def describe_tree(root: Path) -> dict[str, object]:
    """The tree's commit and whether the library's files differ from it (for the JSON)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = git("status", "--porcelain", "--", "gym_concurrency", "middleware")
    return {
        "path": str(root),
        "commit": git("rev-parse", "HEAD"),
        "subject": git("log", "-1", "--format=%s"),
        "library_changes_uncommitted": changed.splitlines(),
    }
