"""The call loop of an outbound client, written once for every transport: a slot of the limit
per attempt, retries as the RetryPolicy says, the adaptive limiter fed, the metrics recorded.

A transport adapter (httpx, aiohttp) only translates: it sends a request, reads a status and
headers, names a failure ("connection", "timeout" or not retryable), throws a response away,
and hands the last response over holding its slot (`Slot.release()` once its body is read in
full or it is closed). Everything else happens here:

- each call asks for a weight and a flow (weights.py), and each attempt waits for that weight
  of `limit` (capped at the limit's size) in that flow (its TimeoutError / QueueFullError /
  LimitUnavailableError reach the caller as the limit raises them, never retried), holds it
  until its response is done with, and gives back the same weight and flow before any
  backoff, whichever path gives it back (the response, the leak guard, the client's close);
- a retry happens only after the server's Retry-After, within `max_attempts`, the deadline
  and the retry budget; a denied retry ends the call with its last response (or error);
- with a `deadline_header`, each attempt tells the server what is left of the deadline;
- on a limit with an upstream, each attempt also takes the call's token estimate with its slot,
  settled from the usage its body reports as it is read (else charged in full), and every
  response's rate-limit headers are told to the budget (upstream.py);
- cancellation anywhere (waiting for a slot, in an attempt, reading a discarded body, backing
  off) gives back what is held and propagates: it is never retried.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from opentelemetry.metrics import MeterProvider

from ..deadline import deadline_remaining
from ..flow import ROUTE_FLOW
from ..limits import Limit
from ..limits.adaptive import AdaptiveController
from ..upstream_view import has_upstream
from .adaptive import AdaptiveConfig, adaptive_limiter
from .budget import RetryBudget
from .deadline_header import check_deadline_header, milliseconds_left
from .metrics import ClientMetrics
from .retry import (
    IDEMPOTENT_METHODS,
    DeniedReason,
    RetryPolicy,
    RetryReason,
    backoff_delay,
    retry_after_delay,
    retry_after_seconds,
    server_says_retry,
)
from .slot import Slot
from .upstream import report_headers, take
from .weights import CallAsk, RequestFlow, RequestWeight

__all__ = ["BodyDeadline", "CallsView", "DeadlineExceeded", "Exchange", "LimitedCalls", "Slot"]

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")
_Request = TypeVar("_Request", contravariant=True)


class DeadlineExceeded(TimeoutError):
    """The call's deadline (its `deadline_seconds`, or what was left of the request's deadline)
    ran out while it waited for a slot or for a response."""


@dataclass(frozen=True, slots=True)
class CallDeadline:
    """When a call must be done (loop time) and the bound it came from, in seconds: the call's
    own `deadline_seconds` or what was left of the request's deadline, whichever is sooner."""

    at: float
    seconds: float

    @classmethod
    def of(cls, own: float | None) -> CallDeadline | None:
        """The deadline of a call starting now, or None if nothing bounds it."""
        seconds = deadline_remaining(own)
        if seconds is None:
            return None
        return cls(asyncio.get_running_loop().time() + seconds, round(seconds, 3))


@dataclass(frozen=True, slots=True)
class BodyDeadline:
    """When (loop time) a response's body must have been read by, and the error for a read
    still going then: the call's `deadline_seconds` bounds its body too."""

    at: float
    error: Callable[[], DeadlineExceeded]


class Exchange(Protocol[_Request, ResponseT]):
    """What a transport adapter translates for the call loop."""

    def method(self, request: _Request) -> str: ...

    def subject(self, request: _Request) -> Any:
        """The request a weight or flow function is called with (the library's own)."""
        ...

    async def send(self, request: _Request) -> ResponseT:
        """One attempt: the response once its status and headers have arrived."""
        ...

    def status(self, response: ResponseT) -> int: ...

    def header(self, response: ResponseT, name: str) -> str | None: ...

    def headers(self, response: ResponseT) -> Mapping[str, str]: ...

    def set_header(self, request: _Request, name: str, value: str) -> None:
        """Set (replace) a header of the request, before an attempt sends it."""
        ...

    def failure(self, error: Exception) -> RetryReason | None:
        """ "connection" (nothing was answered), "timeout" (no answer in time), or None: not
        an error a retry can help."""
        ...

    def replayable(self, request: _Request) -> bool:
        """Whether the request's body can be sent again."""
        ...

    async def discard(self, response: ResponseT) -> None:
        """Close a response that will be retried (reading a short body first, so the
        connection can be reused)."""
        ...

    def hand_over(
        self, response: ResponseT, slot: Slot, deadline: BodyDeadline | None
    ) -> ResponseT:
        """The caller's response, which releases `slot` once its body is read in full or it
        is closed (at once if it has no body left); a read of its body still going at the
        `deadline` fails with the deadline's error."""
        ...

    def deadline_exceeded(
        self, request: _Request, seconds: float, part: str = "response"
    ) -> DeadlineExceeded:
        """The error a call cut off by its deadline raises (a DeadlineExceeded), waiting for
        its `part` ("response", or "whole body")."""
        ...


class LimitedCalls(Generic[RequestT, ResponseT]):
    """Outbound calls through one limit, retried by one policy (None: one attempt each), with
    one retry budget, adaptive limiter and set of metrics for all of them; each call asks for
    `weight` in `flow` (constants, or functions of the request: see weights.py). With a
    `deadline_header`, each attempt of a call with a deadline sends what is left of it
    (deadline_header.py)."""

    __slots__ = (
        "__weakref__",
        "_budget",
        "_exchange",
        "_metrics",
        "_overload",
        "ask",
        "deadline_header",
        "limit",
        "limiter",
        "retry",
    )

    def __init__(
        self,
        limit: Limit,
        exchange: Exchange[RequestT, ResponseT],
        *,
        retry: RetryPolicy | None = None,
        adaptive: AdaptiveConfig | AdaptiveController | None = None,
        meter_provider: MeterProvider | None = None,
        weight: RequestWeight = 1,
        flow: RequestFlow = ROUTE_FLOW,
        deadline_header: str | None = None,
        tokens: RequestWeight | None = None,
    ) -> None:
        if not all(hasattr(limit, name) for name in ("acquire", "try_acquire", "release")):
            raise TypeError(
                f"limit must be a gym_concurrency Limit (MeteredSemaphore, SharedLimit), got "
                f"{limit!r}"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy or None, got {retry!r}")
        self.limit = limit
        self.retry = retry
        self.ask = CallAsk(limit, weight, flow, tokens)
        self.deadline_header = check_deadline_header(type(self).__name__, deadline_header)
        self._exchange = exchange
        self.limiter, self._overload = adaptive_limiter(limit, adaptive)
        self._budget = (
            RetryBudget(retry.budget_ratio, retry.budget_min_per_second)
            if retry is not None
            else None
        )
        self._metrics = ClientMetrics(limit, meter_provider)

    def set_retry(self, retry: RetryPolicy | None) -> None:
        """Retry later calls by `retry` (a reload); the budget keeps what it has counted."""
        self.retry = retry
        if retry is None:
            self._budget = None
        elif self._budget is None:
            self._budget = RetryBudget(retry.budget_ratio, retry.budget_min_per_second)
        else:
            self._budget.set_bound(retry.budget_ratio, retry.budget_min_per_second)

    @property
    def budget(self) -> RetryBudget | None:
        """The retry budget all calls share (None without a policy)."""
        return self._budget

    async def call(self, request: RequestT) -> ResponseT:
        """Send `request`, retried as the policy says; the last response, unchanged, holding
        its slot until its body is read in full or it is closed."""
        subject = self._exchange.subject(request)
        weight, flow = self.ask.of(subject)
        tokens = self.ask.tokens_of(subject, weight) if has_upstream(self.limit) else None
        policy = self.retry
        deadline = CallDeadline.of(None if policy is None else policy.deadline_seconds)
        if self._budget is not None:
            self._budget.first_attempt()
        attempt = 1
        while True:
            slot = await self._take_slot(request, deadline, weight, flow, tokens)
            try:
                response = await self._send(request, deadline)
            except Exception as error:
                delay = self._after_error(request, slot, error, attempt, deadline)
                if delay is None:
                    raise
            except BaseException:  # cancelled: never retried
                slot.release(measured=False)
                raise
            else:
                delay = await self._after_response(request, response, slot, attempt, deadline)
                if delay is None:
                    return self._exchange.hand_over(response, slot, self._body(request, deadline))
            await asyncio.sleep(delay)  # holding no slot
            attempt += 1

    async def _take_slot(
        self,
        request: RequestT,
        deadline: CallDeadline | None,
        weight: int,
        flow: Hashable,
        tokens: int | None,
    ) -> Slot:
        limit = self.limit
        weight = self.ask.capped_weight(weight)  # by the limit's size now: it may move
        if deadline is None and tokens is None:  # the common path, as cheap as it was
            await limit.acquire(weight, flow)
            return Slot(limit, self.limiter, weight, flow)
        timeout = asyncio.timeout_at(None if deadline is None else deadline.at)
        try:
            async with timeout:  # cut off, it leaves the queue
                if tokens is None:
                    await limit.acquire(weight, flow)
                else:
                    settlement = await take(limit, weight, flow, tokens)
                    return Slot(limit, self.limiter, weight, flow, settlement)
        except TimeoutError:
            if deadline is not None and timeout.expired():
                raise self._deadline_error(request, deadline.seconds) from None
            raise  # the limit's own timeout
        return Slot(limit, self.limiter, weight, flow)

    async def _send(self, request: RequestT, deadline: CallDeadline | None) -> ResponseT:
        if deadline is None:
            return await self._exchange.send(request)
        if self.deadline_header is not None:  # what is left now, after the wait for a slot
            self._exchange.set_header(request, self.deadline_header, milliseconds_left(deadline.at))
        timeout = asyncio.timeout_at(deadline.at)
        try:
            async with timeout:
                return await self._exchange.send(request)
        except TimeoutError:
            if timeout.expired():
                raise self._deadline_error(request, deadline.seconds) from None
            raise

    def _deadline_error(
        self, request: RequestT, seconds: float, part: str = "response"
    ) -> DeadlineExceeded:
        return self._exchange.deadline_exceeded(request, seconds, part)

    def _body(self, request: RequestT, deadline: CallDeadline | None) -> BodyDeadline | None:
        if deadline is None:
            return None
        return BodyDeadline(
            deadline.at, lambda: self._deadline_error(request, deadline.seconds, "whole body")
        )

    def _after_error(
        self,
        request: RequestT,
        slot: Slot,
        error: Exception,
        attempt: int,
        deadline: CallDeadline | None,
    ) -> float | None:
        """Release the attempt's slot; the delay before a retry, or None to raise `error`."""
        reason = None if isinstance(error, DeadlineExceeded) else self._exchange.failure(error)
        slot.overload = reason is not None
        slot.release(measured=reason is not None)
        policy = self.retry
        if policy is None or reason is None:
            return None
        if reason == "timeout" and self._exchange.method(request).upper() not in IDEMPOTENT_METHODS:
            return None  # the server may have acted on it: only an idempotent request is resent
        delay = backoff_delay(policy, attempt)
        if not self._grant(request, attempt, delay, deadline):
            return None
        self._metrics.retried(reason, delay, "backoff")
        return delay

    async def _after_response(
        self,
        request: RequestT,
        response: ResponseT,
        slot: Slot,
        attempt: int,
        deadline: CallDeadline | None,
    ) -> float | None:
        """The delay before a retry (the response thrown away, its slot released), or None:
        this response is the call's answer."""
        exchange = self._exchange
        status = exchange.status(response)
        slot.overload = status in self._overload
        if slot.settlement is not None:  # the provider's word on what remains, on every answer
            report_headers(self.limit, exchange.headers(response))
        policy = self.retry
        if policy is None:
            return None
        if not server_says_retry(policy, status, exchange.header(response, "x-should-retry")):
            return None
        told = retry_after_seconds(
            exchange.header(response, "retry-after-ms"),
            exchange.header(response, "retry-after"),
            time.time(),
        )
        delay = backoff_delay(policy, attempt) if told is None else retry_after_delay(policy, told)
        too_long = told is not None and told > policy.max_retry_after_seconds
        if not self._grant(request, attempt, delay, deadline, too_long):
            return None
        try:
            await exchange.discard(response)
        finally:
            slot.release()
        self._metrics.retried("status", delay, "backoff" if told is None else "retry_after")
        return delay

    def _grant(
        self,
        request: RequestT,
        attempt: int,
        delay: float,
        deadline: CallDeadline | None,
        retry_after_too_long: bool = False,
    ) -> bool:
        """Whether the retry after `attempt` may be made after `delay`; a denial is counted."""
        policy, budget = self.retry, self._budget
        assert policy is not None, "only a call with a policy is retried"
        assert budget is not None, "a policy comes with a budget"
        denied: DeniedReason
        if attempt >= policy.max_attempts:
            denied = "attempts"
        elif retry_after_too_long:
            denied = "retry_after_too_long"
        elif deadline is not None and asyncio.get_running_loop().time() + delay >= deadline.at:
            denied = "deadline"
        elif not self._exchange.replayable(request):
            return False  # a one-shot body: nothing to resend (not a denial)
        elif not budget.try_retry():
            denied = "budget"
        else:
            return True
        self._metrics.denied(denied)
        return False


class CallsView:
    """What a transport adapter shows of its calls: the limit and the retry policy."""

    __slots__ = ()
    calls: LimitedCalls[Any, Any]

    @property
    def limit(self) -> Limit:
        """The limit every attempt takes a slot of."""
        return self.calls.limit

    @property
    def retry(self) -> RetryPolicy | None:
        """The retry policy (None: one attempt per call)."""
        return self.calls.retry

    @property
    def weights_capped(self) -> int:
        """Attempts that asked for more weight than the limit's size, and took all of it."""
        return self.calls.ask.capped

    def __repr__(self) -> str:
        return f"<{type(self).__name__} limit={self.limit!r} retry={self.retry!r}>"
