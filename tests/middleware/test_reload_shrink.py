"""A settings reload that shrinks a route's limit below the weight of the request at the head
of its queue, in a real uvicorn server under a flood of weighted requests (reload_flood.py):
the head is admitted at the new size, the queue behind it drains, every request answers 200
well within the bound, and the limit ends with nothing held and nothing queued."""

from __future__ import annotations

from gym_concurrency import MeteredSemaphore
from tests.middleware.reload_flood import (
    COSTS,
    Served,
    flood_and_shrink,
    reloadable_app,
    route_limit,
    weighted,
)
from tests.servers import UvicornServer


async def test_a_reload_below_the_head_waiters_weight_drains_the_queue(component: str) -> None:
    app, gate = reloadable_app(lambda size: weighted(component, size))
    with UvicornServer(app) as server:
        limit = route_limit(app)
        assert isinstance(limit, MeteredSemaphore)
        outcome = await flood_and_shrink([Served(server.url, gate, limit)], flood=40)
        print(f"reload-shrink, process limit: {outcome}")
        assert outcome.unfinished == 0, outcome
        assert outcome.statuses == [200] * 42
        assert outcome.drain_seconds < 10.0
        assert (limit.limit, limit.active, limit.queue_depth) == (2, 0, 0)
        assert limit.flow_statistics() == []
        # The head (8) and every request of the flood heavier than 2: all queued at the reload.
        assert limit.admission_capped == 1 + sum(c > 2 for c in (COSTS * 4)[:40])
