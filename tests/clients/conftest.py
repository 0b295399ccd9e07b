"""Fixtures of the outbound-client tests: one real uvicorn for the session serving a fresh
Upstream per test, a limit per test that must be back to idle after it, and a redis-server."""

from __future__ import annotations

import gc
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gym_concurrency import MeteredSemaphore
from tests.clients.upstream import Upstream
from tests.servers import UvicornServer
from tests.shared.redis_server import RedisServer


class _Switch:
    """The ASGI app uvicorn serves: whichever Upstream the current test installed."""

    def __init__(self) -> None:
        self.app: Upstream = Upstream()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            message = await receive()
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
            assert message["type"] == "lifespan.shutdown"
            await send({"type": "lifespan.shutdown.complete"})
            return
        await self.app(scope, receive, send)


@pytest.fixture(scope="session")
def served() -> Iterator[tuple[UvicornServer, _Switch]]:
    switch = _Switch()
    with UvicornServer(switch) as server:
        yield server, switch


@pytest.fixture
def upstream(served: tuple[UvicornServer, _Switch]) -> Upstream:
    """A fresh upstream for this test, at `upstream.url`."""
    server, switch = served
    switch.app = Upstream(server.url)
    return switch.app


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A component name no other test uses."""
    return re.sub(r"\W", "_", request.node.name)[:50] + "_" + uuid.uuid4().hex[:6]


@pytest.fixture
async def limit(name: str) -> AsyncIterator[MeteredSemaphore]:
    """A named limit of 4 slots; after the test it must hold none and queue none, in any
    flow (a weight given back in another flow than it was taken would show here)."""
    semaphore = MeteredSemaphore(4, component=name, limit_name="judge", server="resources")
    yield semaphore
    assert (semaphore.active, semaphore.queue_depth) == (0, 0), "a slot leaked"
    assert semaphore.flow_statistics() == [], "a flow still holds weight"


@pytest.fixture(autouse=True)
def _collected_after() -> Iterator[None]:
    """Limits a test made (some held in reference cycles: exec'd doc blocks, apps) are gone
    after it, so that no later test's metrics see them."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    yield server
    server.stop()
