"""Which Python runs the NeMo Gym tests: 3.13 and later, never skipped there."""

from __future__ import annotations

import sys

import pytest

NEMO_GYM_VERSION = "0.7.0"
NEMO_GYM_PYTHON = sys.version_info >= (3, 13)
NEMO_GYM_SKIP_REASON = (
    f"NeMo Gym {NEMO_GYM_VERSION} needs Python >= 3.13 (it declares 3.13.14); this is "
    f"{sys.version.split()[0]}. These tests run on 3.13, where they never skip."
)

# For single tests and parameters of modules that run on every Python.
needs_nemo_gym = pytest.mark.skipif(not NEMO_GYM_PYTHON, reason=NEMO_GYM_SKIP_REASON)


def skip_module_without_nemo_gym() -> None:
    """At the top of a module that imports NeMo Gym: skip it before 3.13, never on 3.13."""
    if not NEMO_GYM_PYTHON:
        pytest.skip(NEMO_GYM_SKIP_REASON, allow_module_level=True)
