"""What one fault run measured, the summary line each test prints, and the settings the
fault tests share (short leases, so that CI runs ten of each in a few minutes)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import redis

from tests.shared.faults.witness import Timeline

# The lease of every limit in the fault tests (s): short, so that 10x the lease stays short.
LEASE = float(os.environ.get("GYM_FAULT_LEASE", "0.8"))
# A multiple of each test's runs (the default: 10 runs of each fault the goals name).
SCALE = float(os.environ.get("GYM_FAULT_SCALE", "1"))
FAST = {"lease_seconds": LEASE, "redis_timeout": round(LEASE / 4, 3)}
# The flows the flooding clients ask in (picked at random per admission): fair queuing
# across processes runs through every fault, the default flow among them.
FLOWS: list[str | None] = [None, "env-a", "env-b"]
# Multiples of the lease for stalls and pauses (0.5x to 10x).
MULTIPLES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 10.0)
CONFIGURATION_KEYS = ("limit", "configured", "state")  # kept when every process stops


def runs(count: int) -> int:
    return max(1, round(count * SCALE))


def multiples(count: int = 10) -> list[float]:
    """`count` multiples spread over 0.5x to 10x (all ten at the default scale)."""
    count = runs(count)
    return [MULTIPLES[round(i * (len(MULTIPLES) - 1) / max(1, count - 1))] for i in range(count)]


@dataclass
class Run:
    fault: str
    detail: str
    peak: int
    over_seconds: float
    recovered_seconds: float | None  # from the fault's end to the limit full again

    @property
    def over(self) -> bool:
        return self.over_seconds > 0


def measure(
    timeline: Timeline,
    fault: str,
    detail: str,
    limit: int,
    start: float,
    end: float,
    *,
    settle: float,
) -> Run:
    """One run's row: the holders over `limit` from `start` until `settle` s after the fault's
    `end`, and how soon after `end` the limit was full again."""
    over = timeline.over(limit, start, end + settle)
    full = timeline.full_again(limit, end)
    return Run(
        fault,
        detail,
        max([i.peak for i in over], default=limit),
        sum(i.seconds for i in over),
        None if full is None else full - end,
    )


def check(line: str, rows: list[Run], *, recovered_within: float) -> None:
    """No run over the limit, and every run full again within `recovered_within` s."""
    assert [r for r in rows if r.over] == [], line
    late = [
        r for r in rows if r.recovered_seconds is None or r.recovered_seconds > recovered_within
    ]
    assert late == [], (f"not full again within {recovered_within} s", line, late)


def summary(fault: str, limit: int, rows: list[Run]) -> str:
    """One line per test, also appended to $GYM_FAULT_REPORT (JSON lines) if set."""
    over = [r for r in rows if r.over]
    recovered = [r.recovered_seconds for r in rows if r.recovered_seconds is not None]
    line = f"{fault}: {len(over)} of {len(rows)} runs over the limit of {limit}"
    if over:
        peak, longest = max(r.peak for r in over), max(r.over_seconds for r in over)
        line += f" (peak {peak}, longest {longest:.2f} s)"
    if recovered:
        line += f"; full again within {max(recovered):.2f} s"
    line += f"; lease {LEASE} s"
    path = os.environ.get("GYM_FAULT_REPORT")
    if path:
        with open(path, "a") as out:
            record = {
                "fault": fault,
                "limit": limit,
                "lease": LEASE,
                "runs": [asdict(r) for r in rows],
                "line": line,
            }
            out.write(json.dumps(record) + "\n")
    print(line)
    return line


def leftover_keys(client: redis.Redis) -> list[str]:
    """Keys left in the limit's Redis but its configuration (every process has stopped)."""
    return sorted(k for k in client.keys("*") if k.rsplit(":", 1)[-1] not in CONFIGURATION_KEYS)
