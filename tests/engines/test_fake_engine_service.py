"""The fake engine's run times: all alike by default; with `service_spread`, spread evenly
around the same mean (runs end apart, as a real engine's do with their output lengths)."""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks._fake_engine import FakeEngine, ceiling


async def run_times(engine: FakeEngine, runs: int) -> list[float]:
    async def one() -> float:
        started = time.monotonic()
        await engine.run(tokens=1)
        return time.monotonic() - started

    return list(await asyncio.gather(*(one() for _ in range(runs))))


async def test_runs_last_the_service_time_without_a_spread() -> None:
    engine = FakeEngine(batch=32, service_seconds=0.05)
    times = await run_times(engine, 16)
    assert max(times) - min(times) < 0.02  # (one loop tick apart at most, generously)
    assert engine.busy_seconds == pytest.approx(16 / 32 * 0.05, rel=0.3)


async def test_a_spread_ends_runs_apart_within_its_bounds() -> None:
    engine = FakeEngine(batch=64, service_seconds=0.1, service_spread=0.5)
    times = await run_times(engine, 64)
    assert min(times) >= 0.05 - 0.005  # 1 - spread of the service time, at least
    assert max(times) <= 0.15 + 0.05  # 1 + spread (and a loaded machine's lateness)
    assert max(times) - min(times) > 0.05  # spread, not alike
    assert sum(times) / len(times) == pytest.approx(0.1, rel=0.2)  # the same mean


def test_the_ceiling_is_full_waves_without_a_spread() -> None:
    assert ceiling(1000, 64, 1.0, 0.0) == pytest.approx(1000 / (64 * 16))  # 15 waves, 40 alone
    assert ceiling(64, 64, 0.2, 0.0) == pytest.approx(1.0)
    assert ceiling(1000, 64, 1.0, 0.5) < ceiling(1000, 64, 1.0, 0.0)  # runs end apart


async def test_a_burst_given_to_the_engine_at_once_reaches_its_ceiling_and_no_more() -> None:
    # The same draws as the engine's: all of a burst given at once (no hand-off at all) keeps
    # the batch as full as the ceiling says, which is therefore what no admission can pass.
    engine = FakeEngine(batch=16, service_seconds=0.05, service_spread=0.5)
    started = time.monotonic()
    await run_times(engine, 100)
    utilisation = engine.busy_seconds / (time.monotonic() - started)
    most = ceiling(100, 16, 0.05, 0.5)
    assert most - 0.15 <= utilisation <= most + 0.01, (utilisation, most)
