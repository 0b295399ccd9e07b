"""Fixtures for the middleware tests: a unique component per test, to find its semaphores
(with tests.registry.limits_of)."""

from __future__ import annotations

import re
import uuid

import pytest


@pytest.fixture
def component(request: pytest.FixtureRequest) -> str:
    """A component name no other test uses, so its limits are this test's alone."""
    return re.sub(r"\W", "_", request.node.name)[:60] + "_" + uuid.uuid4().hex[:6]
