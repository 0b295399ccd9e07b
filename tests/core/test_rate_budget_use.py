"""What a RateBudget gets out of a provider's minute, measured on a simulated clock: calls of
100 to 16,000 tokens, estimated at their `max_tokens` and using 40 to 100 % of it, wait in
FIFO order for the budget and up to 64 run at once (0.3 s + 0.5 ms a token), for 20 minutes
against a provider that meters 60,000 tokens a minute as benchmarks/_fake_provider.py does
(a sliding window, or a token bucket), seeing each call 5 ms after it was admitted.

The sliding budget is never refused by either provider; a bucket is never refused by a bucket
provider and uses nearly all of it, but a sliding provider refuses it (docs/rate-budgets.md).
"""

from __future__ import annotations

import heapq
import random

import pytest

from benchmarks._fake_provider import SlidingWindow, TokenBucket
from gym_concurrency.limits.rate_budget import RateBudget, Reservation

MINUTE = 60_000
LATENCY = 0.005


def served(shape: str, meter: str, minutes: int = 20) -> tuple[float, int]:
    """(Tokens the provider served over the run's middle minutes / the budget of those
    minutes, calls the provider refused)."""
    rng = random.Random(35)
    now = start = 1000.37
    end = start + minutes * 60
    clock = [now]
    budget = RateBudget(tokens_per_minute=MINUTE, shape=shape, clock=lambda: clock[0])  # type: ignore[arg-type]
    provider = (SlidingWindow if meter == "sliding" else TokenBucket)(MINUTE, 60.0)
    in_flight: list[tuple[float, int, Reservation, int]] = []
    used_total, refused, estimate = 0, 0, rng.randint(100, 16_000)
    while now < end:
        clock[0] = now
        result = budget.reserve(estimate) if len(in_flight) < 64 else None
        if isinstance(result, Reservation):
            used = round(estimate * rng.uniform(0.4, 1.0))
            if provider.wait(used, now + LATENCY) != 0.0:
                refused += 1
                budget.cancel(result)
                now += 0.05
                continue
            provider.charge(used, now + LATENCY)
            if start + 60 <= now < end - 60:
                used_total += used
            done = now + 0.3 + estimate / 2000
            heapq.heappush(in_flight, (done, id(result), result, used))
            estimate = rng.randint(100, 16_000)
            continue
        wake = now + result if isinstance(result, float) else float("inf")
        if in_flight and in_flight[0][0] <= wake:
            done, _, reservation, used = heapq.heappop(in_flight)
            now = clock[0] = max(now, done)
            budget.settle(reservation, used)
        else:
            now = wake
    return used_total / (MINUTE * (minutes - 2)), refused


@pytest.mark.parametrize("meter", ["sliding", "bucket"])
def test_a_sliding_budget_is_never_refused_and_uses_most_of_the_minute(meter: str) -> None:
    share, refused = served("sliding", meter)
    assert refused == 0
    assert share >= 0.88  # measured 0.893: a call waiting for room leaves it idle meanwhile


def test_a_bucket_against_a_bucket_uses_the_whole_minute_unrefused() -> None:
    share, refused = served("bucket", "bucket")
    assert refused == 0
    assert share >= 0.98  # measured 0.994


def test_a_bucket_against_a_sliding_window_is_refused() -> None:
    _, refused = served("bucket", "sliding")
    assert refused > 100  # measured thousands: one minute may take up to two minutes' worth
