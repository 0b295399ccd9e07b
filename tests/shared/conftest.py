"""Fixtures of the shared-limit tests: a real redis-server per session (and one per test for
the tests that pause or restart it), and a unique limit key per test."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.shared.helpers import Limits
from tests.shared.redis_server import RedisServer

_names = itertools.count(1)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session's tests that leave it running."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, to pause or restart."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
async def on_own(own_redis: RedisServer, key: str) -> AsyncIterator[Limits]:
    """Makes SharedLimits on this test's own Redis (to pause or restart); closes them after."""
    made = Limits(own_redis.url, key)
    yield made
    await made.close()


@pytest.fixture
def key() -> str:
    """A limit key no other test uses."""
    return f"t{next(_names)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def limits(redis_server: RedisServer, key: str) -> AsyncIterator[Limits]:
    """Makes SharedLimits on the session's Redis, all on this test's key; closes them after."""
    made = Limits(redis_server.url, key)
    yield made
    await made.close()
