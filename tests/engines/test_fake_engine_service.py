"""The fake engine's run times: all alike by default; with `service_spread`, spread evenly
around the same mean (runs end apart, as a real engine's do with their output lengths)."""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks._fake_engine import FakeEngine


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
