"""The upstream side of an outbound call on a limit with a rate budget or an engine signal:
its admission takes the call's token estimate with the slots (`take`), its reservation is
settled from the response body as the caller reads it (settlement.py), and every response's
rate-limit headers, a 429's included, tighten the budget (`report_headers`)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping

from ..limits import Limit
from ..settlement import Settlement
from ..upstream_view import budget_of
from .provider_headers import provider_readings, report_readings

__all__ = ["report_headers", "take"]


async def take(limit: Limit, weight: int, flow: Hashable, tokens: int) -> Settlement | None:
    """Wait for `weight` of `limit` in `flow` and `tokens` of its upstream together (raising as
    `acquire()` does: UpstreamCapacityError when the upstream kept it out); the settlement of
    the reservation taken (None: the limit has no budget). Cancelled, nothing is held."""
    held = await limit.hold(weight, flow, tokens=tokens).__aenter__()  # released by the Slot
    budget = budget_of(limit)
    if held.reservation is None or budget is None:
        return None
    return Settlement(budget, held.reservation)


def report_headers(limit: Limit, headers: Mapping[str, str]) -> None:
    """Tell `limit`'s budget what the provider's rate-limit headers say remains (nothing
    without a budget or such headers); its clock is the loop's."""
    budget = budget_of(limit)
    if budget is None:
        return
    readings = provider_readings(headers)
    if readings:
        report_readings(budget, readings, now=asyncio.get_running_loop().time())
