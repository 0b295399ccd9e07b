"""The refusal cascade of a bounded `episode` queue, warned about once per limit.

An `episode` refusal is answered at once, and NeMo Gym's rollout collector sends its next task
as soon as a reply comes back. When more tasks are in flight than the route's slots plus its
queue bound, every refusal frees a collector slot for another task that is refused in turn: a
run ends with most of its rollouts failed. A shed on such a route proves that many arrived at
once, so the first one is logged with the numbers and what to set instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .limits import LimitedRoute

__all__ = ["CascadeWarning"]

_log = logging.getLogger("gym_concurrency.middleware")


class CascadeWarning:
    """Logs one warning per limit name the first time an `episode` route sheds."""

    __slots__ = ("_warned",)

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def shed(self, route: LimitedRoute) -> None:
        """A request on `route` was just refused from a full queue."""
        config = route.config
        if not route.failures.episode or config.limit_name in self._warned:
            return
        self._warned.add(config.limit_name)
        limit = route.limit
        arrived = limit.active + limit.queue_depth + 1
        _log.warning(
            "gym_concurrency: route %s (limit %r, failure 'episode') refused a request from a "
            "full queue: %d running (max_concurrent=%d), %d queued (max_queue=%s), so at least %d "
            "requests arrived at once. An episode refusal is answered at once and the rollout "
            "collector sends its next task as soon as one returns, so with max_queue below the "
            "number of rollouts it keeps in flight (num_samples_in_parallel, gym eval run "
            "--concurrency) minus max_concurrent, each refusal makes room for the next: most of "
            "a run can fail this way. Set max_queue to at least that number (here more than "
            "%d), or leave it unset and bound the wait with queue_timeout_seconds "
            "(docs/settings.md). Logged once per limit.",
            config.path,
            config.limit_name,
            limit.active,
            limit.limit,
            limit.queue_depth,
            config.max_queue,
            arrived,
            limit.queue_depth,
        )
