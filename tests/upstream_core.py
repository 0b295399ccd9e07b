"""`with_core`: skips a test until the core's upstream admission (issue 35:
gym_concurrency.limits.upstream, refusals "budget" / "saturated") is in the tree."""

from __future__ import annotations

import importlib.util

import pytest

with_core = pytest.mark.skipif(
    importlib.util.find_spec("gym_concurrency.limits.upstream") is None,
    reason="needs the core's upstream admission (gym_concurrency.limits.upstream)",
)
