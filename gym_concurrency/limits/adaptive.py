"""Limits that move: controllers that set a limit from the latency and the overload answers of
the work it admits, within a floor and a ceiling. (The hand-over rate behind an automatic
Retry-After is `HandoverRate`, in handover_rate.py.)

A controller is fed one sample per admitted piece of work that finished: when it was admitted,
when it finished, whether it ended in overload (the app answered 429 / 503 or raised) and how
many slots were held. Samples are pooled in windows; when a window closes the controller
decides once, and only from work admitted under the limit then in force (a sample admitted
before the last change says nothing about the new limit). `AdaptiveLimiter` binds a controller
to any `Limit` and calls its `resize()`. Everything here is plain arithmetic on numbers the
caller passes in (times included): no framework, no OpenTelemetry, no clock of its own; the
observer reports the moving limit like any other.

Guard-rails, both algorithms: the limit stays within [min_limit, max_limit] whatever happens
(the floor is never undercut, not even to measure); the limit grows only when the window used
it all (no growth on an idle limit) and only while latency is within `tolerance` of the
baseline, so a queue standing in front of the limit cannot make it creep upward
(Netflix concurrency-limits#134); the baseline (the latency of unloaded work) is re-measured
by a short, bounded step down to `probe_factor` of the limit, never down to the floor, and the
work that would have been admitted waits in the queue meanwhile rather than being refused
(envoy#9007, #46602).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import ClassVar, Literal, Protocol, TypedDict, Unpack

__all__ = [
    "AdaptiveController",
    "AdaptiveLimiter",
    "AimdController",
    "Algorithm",
    "GradientController",
    "Tuning",
    "limiter_of",
    "make_controller",
]

Algorithm = Literal["gradient", "aimd"]

DEFAULT_TOLERANCE = 1.25  # latency up to 1.25x the baseline is not taken as a sign of overload
DEFAULT_MIN_SAMPLES = 10  # samples in a window, at least (and at least one per slot)
DEFAULT_PROBE_SECONDS = 10.0  # re-measure the baseline this often (and not more often than
PROBE_MIN_WINDOWS = 16  # ... every 16 windows), at PROBE_FACTOR of the limit, never below
DEFAULT_PROBE_FACTOR = 0.75  # the floor
DEFAULT_AIMD_BACKOFF = 0.9
AIMD_MAX_HOLD = 16  # windows, at most, that AIMD waits to grow back to a limit that backed off
FASTER = 0.8  # a window this much faster than the baseline re-bases it at once


class Tuning(TypedDict, total=False):
    """How a controller measures, the same for every algorithm (defaults below)."""

    min_samples: int  # samples in a window, at least (and at least one per slot used)
    probe_seconds: float | None  # re-measure the baseline this often (None: never)
    probe_factor: float  # ... at this fraction of the limit


class Resizable(Protocol):
    """What a controller drives: any `gym_concurrency.limits.Limit` has it."""

    @property
    def limit(self) -> int: ...
    @property
    def active(self) -> int: ...

    def resize(self, limit: int) -> None: ...


class AdaptiveController:
    """The window machinery both algorithms share: samples in, at most one decision per
    window out. Subclasses decide in `_decide` (a float estimate, clamped here)."""

    algorithm: ClassVar[Algorithm]

    __slots__ = (
        "_baseline",
        "_changed_at",
        "_estimate",
        "_latencies",
        "_limit",
        "_max_inflight",
        "_min_samples",
        "_next_probe",
        "_overloads",
        "_probe_factor",
        "_probe_seconds",
        "_probe_window",
        "_probing",
        "_samples",
        "max_limit",
        "min_limit",
        "tolerance",
        "windows",
    )

    def __init__(
        self,
        min_limit: int,
        max_limit: int,
        initial: int | None = None,
        *,
        tolerance: float | None = DEFAULT_TOLERANCE,
        **tuning: Unpack[Tuning],
    ) -> None:
        min_samples = tuning.get("min_samples", DEFAULT_MIN_SAMPLES)
        probe_seconds = tuning.get("probe_seconds", DEFAULT_PROBE_SECONDS)
        probe_factor = tuning.get("probe_factor", DEFAULT_PROBE_FACTOR)
        if not 1 <= min_limit <= max_limit:
            raise ValueError(f"need 1 <= min_limit <= max_limit, got {min_limit}, {max_limit}")
        initial = min_limit if initial is None else initial
        if not min_limit <= initial <= max_limit:
            raise ValueError(f"initial limit {initial} is outside [{min_limit}, {max_limit}]")
        if tolerance is not None and not (tolerance > 1 and math.isfinite(tolerance)):
            raise ValueError(f"tolerance must be > 1 (a latency ratio), got {tolerance}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples}")
        if not 0 < probe_factor < 1:
            raise ValueError(f"probe_factor must be between 0 and 1, got {probe_factor}")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.tolerance = tolerance
        self.windows = 0  # windows closed so far
        self._min_samples = min_samples
        self._probe_seconds = probe_seconds
        self._probe_factor = probe_factor
        self._limit = initial
        self._estimate = float(initial)
        self._baseline: float | None = None
        self._changed_at = -math.inf  # samples admitted before this say nothing of the limit
        self._next_probe: float | None = None
        self._probe_window = 0
        self._probing: float | None = None  # the estimate to go back to after a probe
        self._samples = 0
        self._overloads = 0
        self._max_inflight = 0
        self._latencies: list[float] = []

    @property
    def limit(self) -> int:
        """The limit the controller wants now."""
        return self._limit

    @property
    def baseline(self) -> float | None:
        """The latency of unloaded work (seconds), once measured."""
        return self._baseline

    def sample(
        self, started: float, finished: float, *, overload: bool, inflight: int
    ) -> int | None:
        """Record one finished piece of work (times in seconds on one clock; `inflight`: slots
        held as it finished, itself included). The new limit if it closed a window that moved
        the limit, else None."""
        if started <= self._changed_at:
            return None  # admitted under an earlier limit (or in the instant it changed)
        self._samples += 1
        if overload:
            self._overloads += 1
        else:
            self._latencies.append(finished - started)
        if inflight > self._max_inflight:
            self._max_inflight = inflight
        # A window is at least min_samples and one sample per slot it used (a round trip),
        # unless its overload answers already decide it: then it closes at once, before more
        # work is sent into the overload (an upstream refusing past its capacity answers at
        # once, and would fill the rest of the window with refusals).
        if overload and self._overloads >= self._overloads_deciding(self._window_size()):
            return self._close_window(finished)
        if self._samples < self._window_size():
            return None
        return self._close_window(finished)

    def _window_size(self) -> int:
        return max(self._min_samples, self._max_inflight)

    def _overloads_deciding(self, size: int) -> int:
        """How many overload answers decide a window of `size` samples (AIMD: any one)."""
        return 1

    def _reset_window(self) -> None:
        self._samples = 0
        self._overloads = 0
        self._max_inflight = 0
        self._latencies = []

    def _close_window(self, now: float) -> int | None:
        self.windows += 1
        # An early close counts its overloads against the window it cut short.
        samples = max(self._samples, self._window_size())
        overloads, saturated = self._overloads, self._max_inflight
        latencies = self._latencies
        self._reset_window()
        rtt = _median(latencies) if latencies else None
        if self._probing is not None:  # this window ran at the probe's limit: a fresh baseline
            estimate = self._probing
            self._probing = None
            if rtt is not None and not overloads:
                self._baseline = rtt
        else:
            if rtt is not None and not overloads:
                baseline = self._baseline
                # Between probes the baseline moves only for a clearly faster upstream: a
                # running minimum would ratchet down on noise, and one that drifts up would
                # follow the latency this limit itself causes (the creep of #134).
                if baseline is None or rtt < baseline * FASTER:
                    self._baseline = rtt
            in_use = saturated >= self._limit
            estimate = self._decide(self._estimate, rtt, overloads / samples, in_use)
            if estimate < self._estimate:  # a decrease takes at least one slot (x0.9 of a
                estimate = min(estimate, self._limit - 1.0)  # small limit would round back)
            estimate = min(float(self.max_limit), max(float(self.min_limit), estimate))
            if self._should_probe(now, estimate, rtt, overloads):
                # From the limit this window ran at (its growth waits): a probe relative to
                # an estimate no window has tried yet could land past the knee.
                self._probing = self._estimate
                estimate = self._estimate * self._probe_factor
        return self._apply(estimate, now)

    def _should_probe(self, now: float, estimate: float, rtt: float | None, overloads: int) -> bool:
        """Time to re-measure the baseline: `probe_seconds` and PROBE_MIN_WINDOWS windows since
        the last probe, and this window was healthy (a probe during overload would take
        overloaded latency for the baseline), or the limit is down at its floor (an upstream
        slower for everyone: the latency there is the new baseline)."""
        if self._probe_seconds is None:
            return False
        if self._next_probe is None:
            self._next_probe = now + self._probe_seconds
            self._probe_window = self.windows + PROBE_MIN_WINDOWS
            return False
        if now < self._next_probe or self.windows < self._probe_window:
            return False
        if overloads or rtt is None:
            return False
        if not self._healthy(rtt) and estimate > self.min_limit:
            return False  # at the floor it cannot shrink further: measure what latency is there
        self._next_probe = now + self._probe_seconds
        self._probe_window = self.windows + PROBE_MIN_WINDOWS
        return True

    def _healthy(self, rtt: float) -> bool:
        return self.tolerance is None or self._ratio(rtt) <= self.tolerance

    def _ratio(self, rtt: float) -> float:
        baseline = self._baseline
        return rtt / baseline if baseline else 1.0

    def _apply(self, estimate: float, now: float) -> int | None:
        estimate = min(float(self.max_limit), max(float(self.min_limit), estimate))
        self._estimate = estimate
        limit = min(self.max_limit, max(self.min_limit, int(estimate + 0.5)))
        if limit == self._limit:
            return None
        self._limit = limit
        self._changed_at = now
        return limit

    def _decide(self, estimate: float, rtt: float | None, overload: float, in_use: bool) -> float:
        raise NotImplementedError

    def __repr__(self) -> str:
        baseline = "unknown" if self._baseline is None else f"{self._baseline * 1000:.1f} ms"
        return (
            f"<{type(self).__name__} limit={self._limit} in [{self.min_limit}, "
            f"{self.max_limit}] baseline={baseline}>"
        )


class GradientController(AdaptiveController):
    """Latency-led: when the window's median latency exceeds `tolerance` times the baseline,
    shrinks by sqrt(baseline / latency) (halfway, in ratio, to the limit Little's law says
    would run at the baseline; at most halving); otherwise, when the window used every slot,
    grows by sqrt(limit) up to where latency last rose and by 1 past it. Overload answers
    shrink it by their fraction of the window (at most half).
    """

    __slots__ = ("_ceiling",)
    algorithm: ClassVar[Algorithm] = "gradient"

    def __init__(
        self,
        min_limit: int,
        max_limit: int,
        initial: int | None = None,
        *,
        tolerance: float = DEFAULT_TOLERANCE,
        **tuning: Unpack[Tuning],
    ) -> None:
        if tolerance is None:
            raise ValueError("the gradient algorithm needs a latency tolerance")
        super().__init__(min_limit, max_limit, initial, tolerance=tolerance, **tuning)
        self._ceiling = math.inf  # the estimate at which latency last rose past tolerance

    def _overloads_deciding(self, size: int) -> int:
        return (size + 1) // 2  # half the window: it halves, the most a window shrinks

    def _decide(self, estimate: float, rtt: float | None, overload: float, in_use: bool) -> float:
        if overload:
            self._ceiling = estimate
            return estimate * max(0.5, 1.0 - overload)
        if rtt is None:
            return estimate
        ratio = self._ratio(rtt)
        assert self.tolerance is not None
        if ratio > self.tolerance:
            self._ceiling = estimate
            return estimate * max(0.5, math.sqrt(1.0 / ratio))
        if not in_use:
            return estimate  # an idle limit gets no evidence to grow on
        step = math.sqrt(estimate)
        if estimate + step > self._ceiling:
            step = 1.0
        return estimate + step


class AimdController(AdaptiveController):
    """Additive increase, multiplicative decrease: +1 after a window that used every slot
    with no overload, times `backoff` (at least one slot) after a window with any overload
    answer, or (with a `tolerance`) whose median latency exceeded `tolerance` times the
    baseline. Growing back to the limit that last backed off waits more windows each time that
    limit backs off again (0, 1, 2, 4, ... up to AIMD_MAX_HOLD): an upstream that refuses its
    fourth call is not sent one every other window."""

    __slots__ = ("_hold", "_refused_at", "_waited", "backoff")
    algorithm: ClassVar[Algorithm] = "aimd"

    def __init__(
        self,
        min_limit: int,
        max_limit: int,
        initial: int | None = None,
        *,
        tolerance: float | None = DEFAULT_TOLERANCE,
        backoff: float = DEFAULT_AIMD_BACKOFF,
        **tuning: Unpack[Tuning],
    ) -> None:
        if not 0 < backoff < 1:
            raise ValueError(f"backoff must be between 0 and 1, got {backoff}")
        if tolerance is None:  # latency is not read: there is no baseline to re-measure
            tuning["probe_seconds"] = None
        super().__init__(min_limit, max_limit, initial, tolerance=tolerance, **tuning)
        self.backoff = backoff
        self._refused_at: int | None = None  # the limit that last backed off
        self._hold = 0  # windows a growth back to it waits
        self._waited = 0

    def _decide(self, estimate: float, rtt: float | None, overload: float, in_use: bool) -> float:
        if overload or (rtt is not None and not self._healthy(rtt)):
            if self._refused_at == self._limit:  # backed off at this limit again
                self._hold = min(max(1, 2 * self._hold), AIMD_MAX_HOLD)
            else:
                self._refused_at, self._hold = self._limit, 0
            self._waited = 0
            return estimate * self.backoff
        if not in_use:
            return estimate
        refused_at = self._refused_at
        if refused_at is not None:
            if self._limit >= refused_at:  # a full, healthy window there: it takes that now
                self._refused_at, self._hold = None, 0
            elif int(estimate + 1.5) >= refused_at and self._waited < self._hold:
                self._waited += 1
                return estimate
        self._waited = 0
        return estimate + 1.0


def make_controller(
    algorithm: Algorithm,
    min_limit: int,
    max_limit: int,
    initial: int | None = None,
    *,
    tolerance: float | None = DEFAULT_TOLERANCE,
    **tuning: Unpack[Tuning],
) -> AdaptiveController:
    """The controller for `algorithm` ("gradient" or "aimd"). `tolerance` None: AIMD ignores
    latency (overload answers only); the gradient algorithm needs one."""
    if algorithm == "gradient":
        if tolerance is None:
            raise ValueError("the gradient algorithm needs a latency tolerance")
        return GradientController(min_limit, max_limit, initial, tolerance=tolerance, **tuning)
    if algorithm == "aimd":
        return AimdController(min_limit, max_limit, initial, tolerance=tolerance, **tuning)
    raise ValueError(f"unknown algorithm {algorithm!r}: expected one of aimd, gradient")


class AdaptiveLimiter:
    """A controller driving a limit: `record()` each finished piece of work; the limit is
    resized when the controller moves it (held slots are never revoked)."""

    __slots__ = ("__weakref__", "controller", "limit", "on_change", "stopped")

    def __init__(
        self,
        limit: Resizable,
        controller: AdaptiveController,
        on_change: Callable[[int, int], object] | None = None,
    ) -> None:
        self.limit = limit
        self.controller = controller
        self.on_change = on_change  # (old, new), after the resize
        self.stopped = False
        _LIMITERS[id(limit)] = self
        if limit.limit != controller.limit:
            limit.resize(controller.limit)

    def record(self, started: float, finished: float, overload: bool) -> None:
        """One admitted piece of work finished (its slot still held)."""
        if self.stopped:
            return
        new = self.controller.sample(
            started, finished, overload=overload, inflight=self.limit.active
        )
        if new is not None:
            old = self.limit.limit
            self.limit.resize(new)
            if self.on_change is not None:
                self.on_change(old, new)

    def stop(self) -> None:
        """Resize the limit no more (another controller, or none, drives it now)."""
        self.stopped = True


# id(limit) -> the limiter driving it, for status views; held weakly (by whoever feeds it).
_LIMITERS: weakref.WeakValueDictionary[int, AdaptiveLimiter] = weakref.WeakValueDictionary()


def limiter_of(limit: object) -> AdaptiveLimiter | None:
    """The live AdaptiveLimiter driving `limit`, if any (for status views)."""
    limiter = _LIMITERS.get(id(limit))
    if limiter is None or limiter.stopped or limiter.limit is not limit:
        return None
    return limiter


def _median(values: list[float]) -> float:
    values.sort()
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2.0
