"""The live semaphores one test's middleware made, found by the test's unique component name."""

from __future__ import annotations

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits import registered_limits


def limits_of(component: str) -> dict[str, MeteredSemaphore]:
    """The live route and operation semaphores of `component`, by limit name."""
    return {str(s.limit_name): s for s in registered_limits() if s.component == component}
