"""Fixtures for the middleware tests: a unique component per test, to find its semaphores."""

from __future__ import annotations

import re
import uuid

import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.observer import registered_semaphores


@pytest.fixture
def component(request: pytest.FixtureRequest) -> str:
    """A component name no other test uses, so its limits are this test's alone."""
    return re.sub(r"\W", "_", request.node.name)[:60] + "_" + uuid.uuid4().hex[:6]


def limits_of(component: str) -> dict[str, MeteredSemaphore]:
    """The live route and operation semaphores of `component`, by limit name."""
    return {str(s.limit_name): s for s in registered_semaphores() if s.component == component}
