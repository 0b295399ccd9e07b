"""The README's middleware example runs as printed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from gym_concurrency.middleware import concurrency_middleware

README = Path(__file__).resolve().parent.parent / "README.md"
# The README's main middleware example (the order examples after it add it too).
MIDDLEWARE_EXAMPLE = "app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)"


def example(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(block for block in blocks if marker in block)


async def test_the_middleware_example_serves_and_limits() -> None:
    namespace: dict[str, Any] = {}
    exec(example(MIDDLEWARE_EXAMPLE), namespace)
    app = namespace["app"]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        episode = await client.post("/run")
        completion = await client.post("/v1/chat/completions")
    assert episode.status_code == 200
    assert episode.json() == {"reward": 1.0}
    assert completion.json() == {"object": "chat.completion"}


async def test_the_order_examples_answer_401_at_once_while_the_limit_is_full() -> None:
    namespace: dict[str, Any] = {}
    exec(example("dispatch=require_token)  # outside"), namespace)
    in_order = namespace["app"]
    exec(example("bypass=no_credentials"), namespace)  # the same imports and settings
    for app in (in_order, namespace["app"]):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            authenticated = {"authorization": "Bearer s3cret"}
            assert (await client.post("/run", headers=authenticated)).status_code == 200
            limit = concurrency_middleware(app).limits.routes[0].limit
            while limit.try_acquire():  # the limit is full
                pass
            try:
                # Answered by the auth at once, not after the route's 30 s queue timeout.
                refused = await client.post("/run", timeout=5)
            finally:
                for _ in range(limit.limit):
                    limit.release()
            assert refused.status_code == 401
            assert (limit.queue_depth, limit.admission_timeouts) == (0, 0)
