"""What a limit asks of its upstream besides slots: a rate budget (rate_budget.py) and an
engine's own load (engines/signal.py). One admission takes slots and the upstream together, or
neither.

`Upstream` is the question itself, O(1) and with no await: may a call of `tokens` go now, and
if not, for how long not. It owns no slots. `UpstreamGate` is one MeteredSemaphore's side of
it: the reservations handed to waiters not yet resumed, the one timer that retries admission
when the budget will hold the waiter chosen next, and the engine listener that retries it
after every scrape. The semaphore (local.py) decides who is next and holds slots for them.

How a wait ends on a limit with an upstream (each ask brings `tokens`, its estimate; None:
its weight; capped at the budget's minute and counted in `admission_capped`):
- "admitted" at once from `enqueue()` when nobody waits and slots and upstream take it now;
- "budget" at once when the budget would hold it only after the limit's timeout or the
  waiter's deadline (counted as a timeout and in `admission_budget`);
- "budget" / "saturated" when its timeout passes while slots are free for the waiter chosen
  next but the upstream holds that one back (counted as a timeout and in
  `admission_budget` / `admission_saturated`); else "timeout", as without an upstream.
The waiter chosen next that the upstream cannot take yet keeps the slots held for it (as a
heavy waiter does): lighter ones pass it only under `backfill_seconds`. While every waiter asks
weight 1 of the default flow and an estimate of 1, charged in full (`async with`), the queue
stays plain FIFO and the oldest is that waiter: nobody behind it asks less; freed slots go to it
from the budget's allowance while that lets them (local.py), without a reservation. One that its
budget alone holds back gets a target when it is first chosen: when its estimate would fit with
nothing more charged, plus `backfill_seconds`. Lighter waiters are admitted past it while they
fit now and leave it its slots, and room in the budget at that target (`RateBudget.spare`): what
it leaves idle while it waits is used, and it is admitted no later (refunds only help; overruns
charged meanwhile may still delay it).
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..engines.signal import EngineSignal, EngineStatistics
from ..safe_urls import safe_url
from .budget_allowance import BudgetAllowance, NoAllowance
from .flows import Waiting
from .limit import Admission, Refusal, UpstreamCapacityError
from .rate_budget import RateBudget, RateBudgetStatistics, Reservation
from .wait_queue import WaitQueue

__all__ = ["Upstream", "UpstreamGate", "UpstreamWait"]

Waiter = asyncio.Future[Admission]
UpstreamRefusal = Literal["budget", "saturated"]


@dataclass(frozen=True, slots=True)
class UpstreamWait:
    """Not now: `seconds` until the budget holds the call (exact), or until the engine may
    admit it (math.inf: not known before a scrape lands); `reason` says which refused."""

    seconds: float
    reason: UpstreamRefusal


class Upstream:
    """A rate budget, an engine signal, or both, asked together (at least one); fixed for its
    life (a limit's gate reads which it has once)."""

    __slots__ = ("budget", "engine")

    def __init__(self, budget: RateBudget | None = None, engine: EngineSignal | None = None):
        if budget is not None and not isinstance(budget, RateBudget):
            raise TypeError(f"budget must be a RateBudget, got {budget!r}")
        if engine is not None and not isinstance(engine, EngineSignal):
            raise TypeError(f"engine must be an EngineSignal, got {engine!r}")
        if budget is None and engine is None:
            raise ValueError("an Upstream needs a budget, an engine or both")
        self.budget = budget
        self.engine = engine

    def capped(self, tokens: int) -> int:
        """`tokens`, or the most the budget can ever hold if it is less (an estimate no
        minute holds would wait forever)."""
        cap = None if self.budget is None else self.budget.largest_estimate
        return tokens if cap is None or tokens <= cap else cap

    def take(
        self, tokens: int, now: float, in_flight: int, spare: list[int] | None = None
    ) -> Reservation | UpstreamWait | None:
        """Admit a call of `tokens` (capped) now, or say how long not: the engine asked first
        (`now`: loop time; `in_flight`: the limit's weight held), then the budget reserved
        (on its own clock; within `spare` if given, else not now: math.inf). Admitted: the
        Reservation (None without a budget), and the engine's count of admissions raised."""
        engine = self.engine
        if engine is not None and not engine.admits(now, in_flight):
            return UpstreamWait(math.inf, "saturated")
        reservation = None
        if self.budget is not None:
            capped = self.capped(tokens)
            taken: Reservation | float | None = (
                self.budget.reserve(capped)
                if spare is None
                else self.budget.reserve_within(capped, spare)
            )
            if not isinstance(taken, Reservation):
                return UpstreamWait(math.inf if taken is None else taken, "budget")
            reservation = taken
        if engine is not None:
            engine.admitted(1)
        return reservation

    def take_in_full(self, tokens: int, in_flight: int) -> float:
        """`take()` for a call that cannot settle, charged in full at once (no Reservation):
        0.0 if admitted, else how long not (math.inf: the engine)."""
        engine = self.engine
        if engine is not None and not engine.admits(_now(), in_flight):
            return math.inf
        if self.budget is not None:
            wait = self.budget.take(self.capped(tokens))
            if wait > 0.0:
                return wait
        if engine is not None:
            engine.admitted(1)
        return 0.0

    def wait(self, tokens: int, now: float | None = None) -> float:
        """Seconds until the budget would hold `tokens` (capped); 0.0 now, or without a
        budget. Reads only: nothing is charged (a Retry-After). `now` is unused: the budget
        reads its own clock."""
        return 0.0 if self.budget is None else self.budget.wait_for(self.capped(tokens))

    def refusal(self, tokens: int, now: float, in_flight: int) -> UpstreamRefusal | None:
        """Which part would refuse a call of `tokens` now ("saturated" first), charging
        nothing; None if both would take it."""
        engine = self.engine
        if engine is not None and not engine.admits(now, in_flight):
            return "saturated"
        return "budget" if self.wait(tokens) > 0.0 else None

    def refused(
        self, describe: str, refusal: UpstreamRefusal, tokens: int
    ) -> UpstreamCapacityError:
        """The error for a wait of `describe` (the limit) that `refusal` ended, for `tokens`:
        its `retry_after` is when the budget would hold them (None for the engine)."""
        if refusal == "budget":
            wait = self.wait(tokens)
            return UpstreamCapacityError(
                f"{describe}: the rate budget could not hold {tokens} tokens within the wait "
                f"allowed (it holds them in {wait:.3f} s)",
                "budget",
                wait,
            )
        url = "?" if self.engine is None else safe_url(self.engine.url)
        message = f"{describe}: the engine at {url} did not admit within the wait allowed"
        return UpstreamCapacityError(message, "saturated", None)

    def statistics(self) -> tuple[RateBudgetStatistics | None, EngineStatistics | None]:
        """The budget's and the engine's statistics now (None for a part not configured)."""
        budget = None if self.budget is None else self.budget.statistics()
        engine = None if self.engine is None else self.engine.statistics()
        return budget, engine

    def __repr__(self) -> str:
        return f"<Upstream budget={self.budget!r} engine={self.engine!r}>"


class UpstreamGate:
    """One MeteredSemaphore's admission through an Upstream.

    `retry` is the semaphore's "admit the next waiters", held weakly: the gate calls it
    when its timer fires (the budget now holds the waiter it was armed for) and after every
    scrape of the engine, and holds the semaphore only weakly (a dropped limit is collected,
    and its engine listener removed with it). `allowance.take_one()` takes an admission of 1
    charged in full from the budget's allowance alone, if it holds it (budget_allowance.py)."""

    __slots__ = (
        "__weakref__",
        "_due",
        "_handed",
        "_retry",
        "_target",
        "_timer",
        "allowance",
        "upstream",
    )

    def __init__(self, upstream: Upstream, retry: Callable[[], None]):
        self.upstream = upstream
        self._retry = weakref.WeakMethod(retry)
        self._handed: dict[Waiter, Reservation] = {}  # admitted, not yet settled or left
        self._timer: asyncio.TimerHandle | None = None
        self._due = math.inf
        self._target: tuple[Waiter, float] | None = None  # the chosen one's, on the budget's clock
        # What an uncontended `async with` asks alone: the budget's allowance (a C call,
        # budget_allowance.py), unless an engine must be asked at every admission.
        budget, alone = upstream.budget, upstream.engine is None
        self.allowance: BudgetAllowance | NoAllowance = (
            budget.allowance if budget is not None and alone else NoAllowance()
        )
        engine = upstream.engine
        if engine is not None:
            listener = _listener(self._retry)
            engine.add_listener(listener)
            weakref.finalize(self, engine.remove_listener, listener)

    @classmethod
    def of(cls, upstream: Upstream | None, retry: Callable[[], None]) -> UpstreamGate | None:
        """A gate for `upstream` (None: none, and no gate)."""
        return None if upstream is None else cls(upstream, retry)

    def admit(
        self, waiter: Waiter, tokens: int, in_flight: int, spare: list[int] | None = None
    ) -> bool:
        """Take the upstream for the queued `waiter` (True: its reservation kept for
        `claim`), within `spare` if it passes the one chosen next (`spare_for`); False: not
        now, and the timer armed for when the budget holds it."""
        loop = waiter.get_loop()
        now = loop.time()
        taken = self.upstream.take(tokens, now, in_flight, spare)
        if isinstance(taken, UpstreamWait):
            if math.isfinite(taken.seconds):
                self._arm(loop, now + taken.seconds)
            return False
        if taken is not None:
            self._handed[waiter] = taken
        return True

    def spare_for(self, queue: WaitQueue, chosen: Waiting) -> list[int] | None:
        """What waiters passing `chosen` (the waiter chosen next, whose slots fit) may take of
        the budget in all so that it fits at its target (see the module), or None if the
        budget takes it now (the engine holds it back) or there is no backfill or budget."""
        budget, seconds = self.upstream.budget, queue.backfill_seconds
        if budget is None or not seconds:
            return None
        tokens = self.upstream.capped(queue.estimate(chosen.waiter))
        if budget.wait_for(tokens) <= 0.0:
            return None
        if self._target is None or self._target[0] is not chosen.waiter:
            self._target = (chosen.waiter, budget.target(tokens, seconds))
        return budget.spare(tokens, self._target[1])

    def take_in_full(self, tokens: int, in_flight: int) -> bool:
        """Take the upstream now for a caller that cannot settle (charged in full at once);
        False if it does not admit now."""
        return self.upstream.take_in_full(tokens, in_flight) == 0.0

    def claim(self, waiter: Waiter) -> Reservation | None:
        """The reservation handed to `waiter` (admitted), now its task's to close."""
        return self._handed.pop(waiter, None)

    def cancel(self, waiter: Waiter) -> None:
        """`waiter` left after it was admitted: its call is never sent, all of it comes back."""
        reservation = self._handed.pop(waiter, None)
        if reservation is not None and self.upstream.budget is not None:
            self.upstream.budget.cancel(reservation)

    def too_late(self, tokens: int, timeout: float | None, deadline: float | None) -> bool:
        """True if the budget holds `tokens` only after `timeout` or `deadline` (seconds from
        now; None: unbounded), whichever is sooner: the wait could not end admitted."""
        if timeout is None and deadline is None:
            return False
        bound = min(b for b in (timeout, deadline) if b is not None)
        return self.upstream.wait(tokens) > bound

    def refusal(self, tokens: int, in_flight: int) -> UpstreamRefusal | None:
        """Which part of the upstream holds back a call of `tokens` now; None: neither."""
        return self.upstream.refusal(tokens, _now(), in_flight)

    def late(self, queue: WaitQueue, active: int, limit: int) -> Refusal:
        """How a timeout ends a wait in `queue` now (`active` of `limit` held): "budget" /
        "saturated" while the slots are free for the waiter chosen next but the upstream
        holds it back; else "timeout"."""
        chosen = queue.choose()
        if chosen is None or active + min(chosen.weight, limit) > limit:
            return "timeout"
        return self.refusal(queue.estimate(chosen.waiter), active) or "timeout"

    def _arm(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        """One timer: armed for `due` unless one is armed sooner already."""
        if self._timer is not None:
            if self._due <= due:
                return
            self._timer.cancel()
        self._due = due
        self._timer = loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self._timer, self._due = None, math.inf
        retry = self._retry()
        if retry is not None:
            retry()


def _now() -> float:
    """The running loop's time; outside one (a try_acquire() from plain code), the monotonic
    clock, which is asyncio's and uvloop's loop time."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def _listener(retry: weakref.WeakMethod[Callable[[], None]]) -> Callable[[], None]:
    """A plain function for the engine's listeners (held strongly there) that holds the
    limit only through `retry`, a weak reference."""

    def scraped() -> None:
        admit = retry()
        if admit is not None:
            admit()

    return scraped
