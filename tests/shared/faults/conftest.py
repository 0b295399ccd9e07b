"""Fixtures of the fault tests: a witness Redis, the limit's own redis-server, and the fleet
of agent processes, all this test's own (each fault pauses, restarts or cuts them off)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shared.faults.fleet import Fleet
from tests.shared.faults.proxy import Proxy
from tests.shared.faults.witness import Witness
from tests.shared.redis_server import RedisServer


@pytest.fixture
def witness(tmp_path: Path) -> Iterator[Witness]:
    folder = tmp_path / "witness"
    folder.mkdir()
    made = Witness(folder)
    yield made
    made.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RedisServer]:
    """The limit's Redis (the one the faults hit)."""
    folder = tmp_path / "store"
    folder.mkdir()
    server = RedisServer(folder)
    yield server
    server.stop()


@pytest.fixture
def fleet(witness: Witness, key: str, tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(witness, key, tmp_path)
    yield made
    made.kill()


@pytest.fixture
def proxy(store: RedisServer) -> Iterator[Proxy]:
    made = Proxy(store.port)
    yield made
    made.close()
