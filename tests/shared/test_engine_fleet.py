"""A global limit that follows an engine for every process (real Redis, the fake engine in a
process of its own): one process at a time scrapes, the limit's size follows the engine's
room, a burst from several processes keeps the engine's queue within waiting_max, a stale
engine sizes the fleet to the floor, and the lease passes on when its holder dies."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from gym_concurrency import SharedLimit
from gym_concurrency.engines import EngineSignal
from gym_concurrency.engines.gauges import EngineLoad
from gym_concurrency.upstream_view import upstream_statistics
from tests.engines.bodies import Bodies, engine_url, vllm
from tests.engines.engine_process import EngineProcess, fake_engine
from tests.servers import eventually, free_port
from tests.shared.helpers import Limits
from tests.shared.redis_server import RedisServer

BATCH, WAITING_MAX = 8, 2
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
TIMING = {"lease_seconds": 3.0, "redis_timeout": 1.0}  # generous: a loaded CI machine


@pytest.fixture
def engine() -> Iterator[EngineProcess]:
    with fake_engine("--batch", str(BATCH), "--service-ms", "150") as process:
        yield process


def signal(engine: EngineProcess, **options: float) -> EngineSignal:
    settings = {"interval_seconds": 0.1, "stale_after_seconds": 0.5, **options}
    return EngineSignal(
        engine.metrics_url, waiting_max=WAITING_MAX, batch_size=BATCH, floor=1, **settings
    )


def fleet(
    limits: Limits, engine: EngineProcess, processes: int, **options: float
) -> list[SharedLimit]:
    """`processes` limits on one key (each stands for a process), following one engine."""
    return [limits(100, engine=signal(engine, **options), **TIMING) for _ in range(processes)]


async def read_fleet(
    limits: Limits, engine: EngineProcess, processes: int, **options: float
) -> list[SharedLimit]:
    """`fleet()`, connected, once a first reading sized it (an idle engine: batch + queue)."""
    made = fleet(limits, engine, processes, **options)
    for limit in made:
        await limit.connect()
    await eventually(lambda: made[0].limit == BATCH + WAITING_MAX, "a first reading", 5)
    return made


def holders(made: list[SharedLimit]) -> list[SharedLimit]:
    return [limit for limit in made if limit._engine is not None and limit._engine.holder]


async def test_one_process_scrapes_for_the_fleet_and_the_size_follows_the_room(
    limits: Limits, engine: EngineProcess
) -> None:
    made = fleet(limits, engine, 3)
    assert [limit.limit for limit in made] == [1, 1, 1]  # the floor until a reading lands
    for limit in made:
        await limit.connect()
    # An idle engine: the whole batch and the queue (capped at batch_size + waiting_max).
    await eventually(lambda: made[0].limit == BATCH + WAITING_MAX, "the size from a reading", 5)
    await asyncio.sleep(0.5)  # five turns more
    assert len(holders(made)) == 1
    scraped = [limit._engine.scrapes for limit in made if limit._engine is not None]
    assert sorted(scraped)[:2] == [0, 0]  # the others never scraped
    for limit in made:  # every process reads the reading the holder wrote
        _, engine_statistics = upstream_statistics(limit)
        assert engine_statistics is not None
        assert (engine_statistics.waiting, engine_statistics.running) == (0.0, 0.0)
        assert not engine_statistics.stale
    # Held slots count: with 4 held the engine is still idle, and the size is 4 + the room.
    for _ in range(4):
        assert await made[1].enqueue() == "admitted"
    await eventually(lambda: made[0].limit == BATCH + WAITING_MAX, "the size, capped", 2)
    for _ in range(4):
        made[1].release()


async def test_a_burst_from_three_processes_keeps_the_engine_queue_within_waiting_max(
    limits: Limits, engine: EngineProcess
) -> None:
    made = await read_fleet(limits, engine, 3)
    answers: list[int] = []

    async def call(limit: SharedLimit, client: httpx.AsyncClient) -> None:
        async with limit:
            response = await client.post(engine.base + "/v1/chat/completions", json=CHAT)
            answers.append(response.status_code)

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200)) as client:
        calls = [call(made[i % 3], client) for i in range(90)]
        await asyncio.wait_for(asyncio.gather(*calls), 60)
    stats = engine.stats()
    assert answers == [200] * 90
    assert stats["max_running"] == BATCH  # the batch was full
    assert stats["max_waiting"] <= WAITING_MAX  # never more than waiting_max waited


async def test_a_stale_engine_sizes_every_process_to_the_floor_until_it_answers(
    limits: Limits, engine: EngineProcess
) -> None:
    made = await read_fleet(limits, engine, 2)
    engine.freeze()  # no scrape answers: the reading goes stale
    try:
        await eventually(lambda: made[0].limit == 1, "the floor", 5)
        await asyncio.sleep(0.2)  # (the resize written)
        assert await made[0].enqueue() == "admitted"
        second = made[1].enqueue()  # the floor holds across processes: it waits
        await asyncio.sleep(0.3)
        assert not second.done()
        made[0].release()
        assert await asyncio.wait_for(second, 5) == "admitted"
        made[1].release()
    finally:
        engine.thaw()
    await eventually(lambda: made[0].limit == BATCH + WAITING_MAX, "a reading again", 5)


async def test_the_lease_passes_on_when_its_holder_dies(
    limits: Limits, engine: EngineProcess
) -> None:
    made = fleet(limits, engine, 2)
    for limit in made:
        await limit.connect()
    await eventually(lambda: len(holders(made)) == 1, "a holder", 5)
    [dead] = holders(made)
    [alive] = [limit for limit in made if limit is not dead]
    limits.kill(dead)  # no renewal of its lease, no scrape, no word to Redis
    assert alive._engine is not None
    await eventually(lambda: alive._engine is not None and alive._engine.holder, "a new holder", 5)
    scrapes = alive._engine.scrapes
    await eventually(lambda: alive._engine is not None and alive._engine.scrapes > scrapes, "", 2)
    assert alive.limit == BATCH + WAITING_MAX


async def test_a_new_holder_starts_from_the_floor_when_the_last_reading_is_stale(
    limits: Limits, engine: EngineProcess
) -> None:
    [limit] = await read_fleet(limits, engine, 1, timeout_seconds=5.0)  # frozen: 5 s a scrape
    lease, _ = limit._store.engine_keys
    # Another process takes the lease and dies at once: its last reading goes stale.
    await limit._store._client.set(lease, "gone:1", px=1500)
    await eventually(lambda: limit._engine is not None and not limit._engine.holder, "", 2)
    engine.freeze()
    try:
        await eventually(lambda: limit._engine is not None and limit._engine.holder, "lease", 5)
        # The floor at once, not after its own scrape fails (5 s): the reading it found is old.
        await eventually(lambda: limit.limit == 1, "the floor", 1)
    finally:
        engine.thaw()
    await eventually(lambda: limit.limit == BATCH + WAITING_MAX, "a reading of its own", 8)


def test_a_shared_limit_takes_only_an_engine_signal() -> None:
    with pytest.raises(TypeError, match="SharedLimit engine must be an EngineSignal"):
        SharedLimit(4, redis_url="redis://127.0.0.1:9/0", key="k", engine="http://x")  # type: ignore[arg-type]


def test_the_room_is_negative_for_a_queue_over_waiting_max_and_none_at_a_full_cache() -> None:
    signal = EngineSignal("http://127.0.0.1:9/metrics", waiting_max=2, batch_size=8, cache_max=0.9)
    assert signal.room(EngineLoad(waiting=0.0, cache_usage=0.5, running=5.0)) == 3 + 2
    assert signal.room(EngineLoad(waiting=5.0, cache_usage=0.5, running=8.0)) == -3
    assert signal.room(EngineLoad(waiting=0.0, cache_usage=0.95, running=1.0)) is None


async def test_an_endless_queue_sizes_the_fleet_to_zero_and_the_reading_stays_fresh(
    limits: Limits,
) -> None:
    """+Inf waiting: the holder's scrape sizes the limit to 0 (no room, a finite count sent to
    Redis), a scrape that succeeded rather than a failure that leaves the last size standing."""
    bodies = Bodies(vllm(0, running=0))
    followed = EngineSignal(
        engine_url(), waiting_max=WAITING_MAX, batch_size=BATCH, floor=1, fetch=bodies,
        interval_seconds=0.1, stale_after_seconds=0.5,
    )  # fmt: skip
    limit = limits(100, engine=followed, **TIMING)
    await limit.connect()
    await eventually(lambda: limit.limit == BATCH + WAITING_MAX, "a first reading", 5)
    bodies.body = vllm(float("inf"), running=BATCH)
    await eventually(lambda: limit.limit == 0, "the size from the endless queue", 5)
    _, engine_statistics = upstream_statistics(limit)
    assert engine_statistics is not None
    assert engine_statistics.waiting == float("inf")
    assert (engine_statistics.stale, engine_statistics.failures) == (False, 0)


async def test_the_local_fallback_of_an_engine_limit_admits_at_most_the_floor(key: str) -> None:
    limit = SharedLimit(
        100, redis_url=f"redis://127.0.0.1:{free_port()}/0", key=key, lease_seconds=1.5,
        redis_timeout=0.5, redis_unavailable="local", local_max_concurrent=50,
        engine=EngineSignal("http://127.0.0.1:9/metrics", waiting_max=2, floor=3),
    )  # fmt: skip
    try:
        for _ in range(3):  # Redis is away: through the fallback, the engine's floor at most
            assert await limit.enqueue() == "admitted"
        fourth = limit.enqueue()
        await asyncio.sleep(0.3)
        assert not fourth.done()
        limit.release()
        assert await asyncio.wait_for(fourth, 5) == "admitted"
        for _ in range(3):
            limit.release()
    finally:
        await limit.close()


async def test_a_holder_that_lost_the_lease_sizes_nothing(
    limits: Limits, engine: EngineProcess
) -> None:
    [limit] = await read_fleet(limits, engine, 1, interval_seconds=1.0, stale_after_seconds=5.0)
    redis = limit._store._client
    lease, _ = limit._store.engine_keys
    await redis.set(lease, "other:1", px=5000)  # another process holds it now
    assert limit._engine is not None
    assert not await limit._engine._size("set", 3)  # (a scrape that landed late, say)
    assert await redis.get(limit.redis_keys["limit"]) == str(BATCH + WAITING_MAX)


async def test_after_a_redis_restart_the_fleet_is_sized_from_a_reading_again(
    on_own: Limits, own_redis: RedisServer, engine: EngineProcess
) -> None:
    """The restarted Redis (no persistence) has no state, lease nor reading: a holder takes
    the lease again and sizes the limit there from a new reading; admissions go on."""
    made = await read_fleet(on_own, engine, 2)
    client = own_redis.client()
    own_redis.restart(down_seconds=0.5)
    size = str(BATCH + WAITING_MAX)
    await eventually(lambda: client.get(made[0].redis_keys["limit"]) == size, "sized again", 15)
    await eventually(lambda: len(holders(made)) == 1, "one holder again", 5)
    waiter = made[1].enqueue()  # (after the restart's grace period, at most a lease)
    assert await asyncio.wait_for(waiter, 15) == "admitted"
    made[1].release()
