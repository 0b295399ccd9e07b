"""The witness: a redis-server of its own (never paused, restarted or proxied) that every
holder reports entering and leaving its held section to, each event timed by that Redis's
clock (`TIME` inside a script), so that events from all processes are in one total order.

The log is a list of `"<µs> <delta> <agent> <how>"` entries: delta +1 (entered), -1 (left) or
0 (a mark the test wrote: `how` is its label). `how` is `r` for a slot Redis granted, `f` for
one the local fallback admitted. `Timeline` reads the log back and measures it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from tests.shared.redis_server import RedisServer

LOG = "witness:log"

# KEYS[1] the log; ARGV[1] delta, ARGV[2] agent, ARGV[3] how. Returns the event's time (µs).
RECORD = """
local t = redis.call('TIME')
local us = t[1] .. string.format('%06d', tonumber(t[2]))
redis.call('RPUSH', KEYS[1], us .. ' ' .. ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
return us
"""


@dataclass(frozen=True)
class Event:
    at: float  # seconds, on the witness's clock
    delta: int
    agent: str
    how: str


@dataclass
class Interval:
    """A stretch of time with more holders than the limit."""

    start: float
    end: float
    peak: int
    holders: dict[str, int] = field(default_factory=dict)  # by agent, at the peak

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Witness:
    """The witness Redis of one test, and the marks the test writes to it."""

    def __init__(self, directory: Path) -> None:
        self.server = RedisServer(directory)
        self.url = self.server.url
        self.client = self.server.client()
        self._record = self.client.register_script(RECORD)

    def mark(self, label: str) -> float:
        """Write a mark; its time (s) on the witness's clock."""
        return int(self._record(keys=[LOG], args=[0, "test", label])) / 1e6

    def now(self) -> float:
        seconds, micros = self.client.time()
        return seconds + micros / 1e6

    def timeline(self) -> Timeline:
        entries = self.client.lrange(LOG, 0, -1)
        events = []
        for entry in entries:
            us, delta, agent, how = entry.split(" ", 3)
            events.append(Event(int(us) / 1e6, int(delta), agent, how))
        return Timeline(events)

    def stop(self) -> None:
        self.client.close()
        self.server.stop()


class Timeline:
    """The witness's log, measured: holders over time, by agent."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.marks = {e.how: e.at for e in events if e.delta == 0}

    def holders(self) -> list[tuple[float, int, dict[str, int]]]:
        """After each event: (time, holders in all, holders by agent)."""
        count = 0
        by_agent: dict[str, int] = {}
        out = []
        for event in self.events:
            if event.delta == 0:
                continue
            count += event.delta
            by_agent[event.agent] = by_agent.get(event.agent, 0) + event.delta
            out.append((event.at, count, dict(by_agent)))
        return out

    def over(
        self,
        limit: int,
        start: float = float("-inf"),
        end: float = float("inf"),
        exclude: dict[str, int] | None = None,
    ) -> list[Interval]:
        """Stretches within [start, end] with more than `limit` holders (less `exclude`:
        holders of an agent not to count, at most that many of it)."""
        intervals: list[Interval] = []
        current: Interval | None = None
        steps = self.holders()
        for (at, count, by_agent), following in itertools.zip_longest(steps, steps[1:]):
            until = following[0] if following is not None else at
            if until < start or at > end:
                continue
            counted = count - sum(
                min(n, by_agent.get(agent, 0)) for agent, n in (exclude or {}).items()
            )
            if counted > limit:
                if current is None:
                    current = Interval(max(at, start), min(until, end), counted, by_agent)
                    intervals.append(current)
                current.end = min(until, end)
                if counted > current.peak:
                    current.peak, current.holders = counted, by_agent
            else:
                current = None
        return intervals

    def peak(self, start: float = float("-inf"), end: float = float("inf")) -> int:
        """The most holders at once within [start, end]."""
        steps = self.holders()
        best = 0
        for (at, count, _), following in itertools.zip_longest(steps, steps[1:]):
            until = following[0] if following is not None else at
            if until >= start and at <= end:
                best = max(best, count)
        return best

    def entries(
        self,
        agent: str | None = None,
        start: float = float("-inf"),
        end: float = float("inf"),
        how: str | None = None,
    ) -> list[Event]:
        """The entering events within [start, end], of `agent` and `how` if given."""
        return [
            e
            for e in self.events
            if e.delta == 1
            and start <= e.at <= end
            and (agent is None or e.agent == agent)
            and (how is None or e.how == how)
        ]

    def grants_over(self, limit: int, start: float, end: float) -> list[Event]:
        """Entries of slots Redis granted (`how` r) within [start, end] that found `limit`
        or more holders already in: a grant Redis made with no free slot."""
        bad = []
        count = 0
        for event in self.events:
            if event.delta == 0:
                continue
            if (
                event.delta == 1
                and event.how == "r"
                and start <= event.at <= end
                and count >= limit
            ):
                bad.append(event)
            count += event.delta
        return bad

    def full_again(self, limit: int, after: float) -> float | None:
        """The first time after `after` with exactly `limit` holders, or None."""
        for at, count, _ in self.holders():
            if at >= after and count == limit:
                return at
        return None
