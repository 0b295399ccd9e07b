"""The request's flow (gym_concurrency.flow): set for a block, it follows the tasks the block
starts and nothing else, is restored after (however the block ends), and `ROUTE_FLOW` reads it
when work starts."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from gym_concurrency.flow import (
    ROUTE_FLOW,
    flow_or_route,
    process_flow,
    request_flow,
    within_flow,
)


async def test_the_flow_holds_in_the_block_and_the_tasks_it_starts() -> None:
    assert request_flow() is None  # no request: the default flow
    with within_flow("tenant-a"):
        assert request_flow() == "tenant-a"
        seen = await asyncio.create_task(_flow_later())
        with within_flow("tenant-b"):  # an inner block (a nested app) wins inside it
            assert request_flow() == "tenant-b"
        assert request_flow() == "tenant-a"
    assert seen == "tenant-a"
    assert request_flow() is None


async def _flow_later() -> object:
    await asyncio.sleep(0)
    return request_flow()


async def test_a_task_started_elsewhere_does_not_see_it() -> None:
    other = asyncio.Event()
    seen: list[object] = []

    async def elsewhere() -> None:
        await other.wait()
        seen.append(request_flow())

    task = asyncio.create_task(elsewhere())  # started before the block: its own context
    with within_flow("tenant-a"):
        other.set()
        await task
    assert seen == [None]


def test_the_flow_is_restored_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), within_flow("tenant-a"):
        raise RuntimeError("handler failed")
    assert request_flow() is None


def test_route_flow_reads_the_request_flow_and_anything_else_stays() -> None:
    assert flow_or_route(ROUTE_FLOW) is None
    with within_flow(("env", 3)):
        assert flow_or_route(ROUTE_FLOW) == ("env", 3)
        assert flow_or_route(None) is None  # said explicitly: the default flow
        assert flow_or_route("batch") == "batch"
    with within_flow(None):  # a request in the default flow
        assert flow_or_route(ROUTE_FLOW) is None
    assert repr(ROUTE_FLOW) == "ROUTE_FLOW"


def test_a_bad_flow_is_refused_naming_it() -> None:
    unhashable = r"within_flow: a flow is hashable, got \['a'\]"
    with pytest.raises(TypeError, match=unhashable), within_flow(["a"]):
        pass
    with pytest.raises(ValueError, match="ROUTE_FLOW"), within_flow(ROUTE_FLOW):
        pass
    assert request_flow() is None


def test_a_process_flow_names_the_host_and_the_process_and_a_forked_child_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mine = process_flow()
    host = socket.gethostname()[:100]
    assert mine == f"{host}:{os.getpid()}"
    assert len(mine) <= 128  # (the middleware's MAX_FLOW_CHARACTERS: never cut)
    # A child forked after the name was kept has another pid, and so a name of its own (not
    # forked here: a fork of this multi-threaded process could deadlock the child).
    child = os.getpid() + 1
    monkeypatch.setattr(os, "getpid", lambda: child)
    assert process_flow() == f"{host}:{child}"
    monkeypatch.undo()
    assert process_flow() == mine
