"""operation_limit handles: a slot is released exactly once however the block ends, and getting
a handle never waits for a worker thread."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from typing import Annotated

import anyio.to_thread
import httpx
import pytest
from fastapi import Depends, FastAPI
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    OperationHandle,
    OperationLimit,
    operation_limit,
)
from gym_concurrency.middleware.limits import ConcurrencyLimits
from servers import eventually

Judge = Annotated[OperationHandle, Depends(operation_limit("judge"))]


def judge_settings(component: str, max_concurrent: int = 1) -> ConcurrencySettings:
    limit = OperationLimit(
        limit_name="judge", operation="judge", executor="inline", max_concurrent=max_concurrent
    )
    return ConcurrencySettings(component=component, operations=[limit])


async def test_a_block_closed_in_another_task_releases_its_slot(component: str):
    # A streaming body suspended at `yield` inside the block and then dropped is closed by
    # asyncio's async-generator finalizer in a task of its own.
    handle = OperationHandle(ConcurrencyLimits(judge_settings(component)).operation("judge"))

    async def body():  # type: ignore[no-untyped-def]
        async with handle:
            yield b"chunk"
            yield b"never"

    async def consume_one() -> None:
        await body().__anext__()

    await asyncio.create_task(consume_one())
    gc.collect()
    for _ in range(10):
        await asyncio.sleep(0)
    assert handle.limit.limit.active == 0
    async with handle as op:  # and the limit still works
        assert handle.limit.limit.active == 1
    assert op.outcome == "ok"


async def test_concurrent_blocks_of_one_handle_each_close_their_own(component: str):
    handle = OperationHandle(ConcurrencyLimits(judge_settings(component, 2)).operation("judge"))
    outcomes: dict[str, str | None] = {}

    async def block(name: str, fail: bool) -> None:
        with pytest.raises(RuntimeError) if fail else contextlib.nullcontext():
            async with handle as op:
                await asyncio.sleep(0.01)
                if fail:
                    raise RuntimeError("judge crashed")
        outcomes[name] = op.outcome

    await asyncio.gather(block("good", False), block("bad", True))
    assert outcomes == {"good": "ok", "bad": "error"}
    assert handle.limit.limit.active == 0


async def test_exiting_more_often_than_entering_is_an_error(component: str):
    handle = OperationHandle(ConcurrencyLimits(judge_settings(component)).operation("judge"))
    with pytest.raises(RuntimeError, match="exited more often than it was entered"):
        await handle.__aexit__(None, None, None)


async def test_getting_a_handle_needs_no_worker_thread(component: str):
    app = FastAPI()
    release = threading.Event()

    @app.post("/blocking")
    def blocking() -> None:  # a sync endpoint: holds a worker thread
        release.wait(10)

    @app.post("/judge")
    async def judge(handle: Judge) -> dict[str, int]:
        async with handle:
            return {"active": handle.limit.limit.active}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=judge_settings(component))
    limiter = anyio.to_thread.current_default_thread_limiter()
    tokens = limiter.total_tokens
    limiter.total_tokens = 1  # every worker thread busy once /blocking runs
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            blocked = asyncio.create_task(client.post("/blocking"))
            await eventually(lambda: limiter.borrowed_tokens == 1, "/blocking to hold a thread")
            with anyio.fail_after(5):
                response = await client.post("/judge")
            release.set()
            await blocked
    finally:
        release.set()
        limiter.total_tokens = tokens
    assert response.json() == {"active": 1}
