"""The edges on a limit shared across processes with a rate budget (`scope="global"`, a
SharedLimit(budget=...)), on a real redis-server: a route limit served by real uvicorn
settles each request's reservation to the usage its response reports, in the budget Redis
keeps (charged in full without one), and an outbound httpx client (LimitedTransport) against
a real upstream settles its calls there too and shares the provider's rate-limit headers with
every other process of the limit. Neither touches the RateBudget the limit was given: it only
sizes the budget kept in Redis."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from gym_concurrency import SharedLimit
from gym_concurrency.clients import LimitedTransport, openai_tokens
from gym_concurrency.limits import registered_limits
from gym_concurrency.limits.rate_budget import BudgetStatistics, RateBudget
from tests.clients.upstream import CHAT_COMPLETION, Reply, Upstream
from tests.middleware.test_route_budget import PATH, chat, serve
from tests.servers import UvicornServer, wait_until
from tests.shared.helpers import FAST, Limits, kept, settle, until_aged, wait_for
from tests.shared.redis_server import RedisServer


@pytest.fixture(autouse=True)
async def aged(redis_server: RedisServer) -> None:
    """A Redis past the grace a young one gives (which counts a missing minute as spent)."""
    await until_aged(redis_server)


def tokens_of(limit: SharedLimit) -> BudgetStatistics:
    """`limit`'s token budget as last seen (the shared one, kept in Redis)."""
    statistics = limit.budget_statistics()
    assert statistics is not None
    assert statistics.tokens is not None
    return statistics.tokens


def untouched(limit: SharedLimit) -> bool:
    """Whether the RateBudget `limit` was made with (its sizes only) was never used."""
    assert limit.budget is not None
    sizes = limit.budget.statistics().tokens
    assert sizes is not None
    return (sizes.reserved, sizes.refunded_total, sizes.reported_remaining) == (0, 0, None)


def figures(limit: SharedLimit) -> tuple[int, int, int, int]:
    """Weight held here; of the token budget: reserved here, refunded here, remaining."""
    spent = tokens_of(limit)
    return limit.active, spent.reserved, spent.refunded_total, spent.remaining


def settles_to(read: Callable[[], object], expected: object, what: str) -> None:
    """Wait until `read()` is `expected` (a failure shows the last value)."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: read() == expected, timeout=5.0, what=what)
    assert read() == expected, what


def test_a_global_route_settles_its_reservations_in_redis(
    redis_server: RedisServer, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The chat route (tests/middleware/test_route_budget.py): 1,000 tokens and 100 requests a
    # minute, each request reserving openai_tokens; here one limit for every process.
    # (Short leases: a Redis younger than a third of one gives a grace period, see `aged`.)
    monkeypatch.setenv("GYM_CONCURRENCY_REDIS_URL", redis_server.url)
    monkeypatch.setenv("GYM_CONCURRENCY_REDIS_LEASE_SECONDS", str(FAST["lease_seconds"]))
    client = redis_server.client()
    with serve(key, scope="global") as server:
        [limit] = [found for found in registered_limits() if found.component == key]
        assert isinstance(limit, SharedLimit)
        answer = httpx.post(server.url + PATH, json=chat(500, use=20))
        assert answer.status_code == 200
        # Reserved 100 + 500 = 600; used 100 + 20: 480 back to the second it was charged in,
        # sent on the release's script call, whose answer this process reads after.
        settles_to(lambda: kept(client, limit)["u"], {"t": 120, "r": 1}, "the refund")
        settles_to(lambda: figures(limit), (0, 0, 480, 880), "the refund, as seen")
        answer = httpx.post(server.url + PATH, json=chat(500, no_usage=True))
        assert answer.status_code == 200
        settles_to(lambda: kept(client, limit)["u"], {"t": 720, "r": 2}, "600 charged")
        settles_to(lambda: figures(limit), (0, 0, 480, 280), "600 charged, as seen")
        assert untouched(limit)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    """A real upstream on uvicorn (tests/clients/upstream.py), answering scripted replies."""
    made = Upstream()
    with UvicornServer(made, lifespan="off") as server:
        made.url = server.url
        yield made


async def test_an_outbound_call_settles_in_redis_and_shares_the_providers_word(
    limits: Limits, redis_server: RedisServer, upstream: Upstream
) -> None:
    client: redis.Redis = redis_server.client()
    budget = RateBudget(tokens_per_minute=10_000, requests_per_minute=100)
    caller, other = limits(4, budget=budget, timeout=1), limits(4, budget=budget, timeout=1)
    assert await other.connect()  # another process of the limit, seen before the call
    usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    provider = {  # another holder of the API key spent most of the provider's minute
        "x-ratelimit-limit-tokens": "10000",
        "x-ratelimit-remaining-tokens": "2000",
        "x-ratelimit-reset-tokens": "30s",
    }
    body = json.dumps({**CHAT_COMPLETION, "usage": usage}).encode()
    upstream.script(PATH, Reply(headers=provider, body=body))
    transport = LimitedTransport(caller, tokens=openai_tokens)
    async with httpx.AsyncClient(base_url=upstream.url, transport=transport) as http:
        answer = await http.post(PATH, json=chat(500))
    assert answer.json()["usage"] == usage
    # Reserved 600 with the slot; the usage read from the body settled it to 120 in Redis,
    # on the release's script call, which carried the provider's reading too.
    await wait_for(lambda: kept(client, caller)["u"] == {"t": 120, "r": 1}, 3.0, "the refund")
    await settle(caller)  # its answer read
    spent = tokens_of(caller)
    assert (spent.reserved, spent.refunded_total, spent.reported_remaining) == (0, 480, 2000)
    assert untouched(caller)
    # The other process learns the reading on its next call (or heartbeat): 2,500 do not fit
    # before the provider's reset (30 s, past its timeout), 100 do.
    assert await other.enqueue(tokens=2500) == "budget"
    seen = tokens_of(other)
    assert (seen.reported_remaining, seen.remaining) == (2000, 2000)
    assert await other.enqueue(tokens=100) == "admitted"
    other.release()
    assert (caller.active, other.active) == (0, 0)
    await settle(caller, other)
