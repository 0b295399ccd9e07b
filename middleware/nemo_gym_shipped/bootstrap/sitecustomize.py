"""Run at the startup of every Python process whose PYTHONPATH holds this folder (put there by
`gym-concurrency-nemo-gym`). With `GYM_CONCURRENCY_NEMO_GYM=1` set, the first `import nemo_gym`
instruments NeMo Gym (`gym_concurrency.middleware.nemo_gym_shipped.install`); a process that
never imports NeMo Gym imports nothing of ours. Then the `sitecustomize` this one shadows, if any
(the next one on sys.path), runs as it would have.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))


class _OnFirstNemoGymImport(importlib.abc.MetaPathFinder):
    """Finds nothing: the first time `nemo_gym` is imported, it installs the instrumentation
    (which patches NeMo Gym's modules as they are imported) and steps aside."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "nemo_gym":
            return None
        sys.meta_path.remove(self)
        try:
            from gym_concurrency.middleware.nemo_gym_shipped import install
        except ImportError as error:  # this venv lacks gym-concurrency: NeMo Gym as shipped
            print(f"gym_concurrency: not instrumenting NeMo Gym: {error}", file=sys.stderr)
            return None
        install()
        return None


def _chain() -> None:
    """Run the next `sitecustomize` on sys.path (the one this module shadows), if there is one."""
    others = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("GYM_CONCURRENCY_NEMO_GYM", "") not in ("", "0", "false", "False"):
    if "nemo_gym" in sys.modules:  # (only if something imported it before site ran)
        from gym_concurrency.middleware.nemo_gym_shipped import install

        install()
    else:
        sys.meta_path.insert(0, _OnFirstNemoGymImport())
_chain()
