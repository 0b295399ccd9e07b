"""`install()`: patch NeMo Gym's modules as they are imported, in this process, if and only if
the installed NeMo Gym is a version the patches were written and tested against.

An import hook (a `sys.meta_path` finder) wraps the loader of each module `patches.PATCHES`
names; right after that module's own code has run, its patch is applied. A module already
imported is patched at once. A NeMo Gym of any other version (or none) is never patched: one
log line says so, and NeMo Gym runs as shipped.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

from .patches import PATCHES

__all__ = ["SUPPORTED_VERSIONS", "install", "installed"]

SUPPORTED_VERSIONS = frozenset({"0.7.0"})
_LOGGER = logging.getLogger("gym_concurrency.nemo_gym")
_lock = threading.Lock()
_state: dict[str, bool] = {}


def installed() -> bool:
    """Whether `install()` has patched (or is patching) NeMo Gym in this process."""
    return _state.get("installed", False)


def install() -> bool:
    """Instrument NeMo Gym in this process (idempotent); False, with one log line on stderr, if
    its version is not one of SUPPORTED_VERSIONS or it is not installed."""
    with _lock:
        if "installed" in _state:
            return _state["installed"]
        version = _nemo_gym_version()
        supported = version in SUPPORTED_VERSIONS
        _state["installed"] = supported
    if not supported:
        found = "not installed" if version is None else f"version {version}"
        print(
            f"gym_concurrency: NeMo Gym {found}; its limits are instrumented only for "
            f"{', '.join(sorted(SUPPORTED_VERSIONS))}: running it as shipped, not patched.",
            file=sys.stderr,
            flush=True,
        )
        return False
    _say_info()
    sys.meta_path.insert(0, _PatchingFinder())
    for name, patch in PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            _apply(name, patch, module)
    return True


def _say_info() -> None:
    """Let the opt-in's INFO lines (where its limits are exported, and why) through: NeMo Gym's
    processes log at WARNING unless told otherwise. A level the user set is kept."""
    if (
        _LOGGER.level == logging.NOTSET
        and logging.getLogger("gym_concurrency").level == logging.NOTSET
    ):
        _LOGGER.setLevel(logging.INFO)


def _nemo_gym_version() -> str | None:
    try:
        return importlib.metadata.version("nemo-gym")
    except importlib.metadata.PackageNotFoundError:
        return None


def _apply(name: str, patch: Callable[[ModuleType], None], module: ModuleType) -> None:
    if getattr(module, "__gym_concurrency_patched__", False):
        return
    setattr(module, "__gym_concurrency_patched__", True)  # noqa: B010 (a module's global)
    try:
        patch(module)
    except Exception:  # never take NeMo Gym down: it runs as shipped, and the log says why
        _LOGGER.exception("gym_concurrency: could not instrument %s; left as shipped", name)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module PATCHES names, it asks the other finders and wraps
    the loader they return, so the patch runs right after the module's own code."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, fullname, patch)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then its patch."""

    def __init__(
        self, loader: importlib.abc.Loader, name: str, patch: Callable[[ModuleType], None]
    ) -> None:
        self._loader, self._name, self._patch = loader, name, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _apply(self._name, self._patch, module)
