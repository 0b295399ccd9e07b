"""The long life of distinct flows (benchmarks/flow_series.py), shortened: 4,000 distinct flows
through 4 limits in a process of its own, a Prometheus scrape of a real SDK MeterProvider after
every 20. Before the vocabulary, the SDK's cardinality limit (2,000 attribute sets) turned the
flow series into `otel_metric_overflow="true"` with no limit name from the 150th export
(2,980 flows) on, and the process kept 8 MiB more for the flows it had seen. Now every export
keeps its limit names and the steady tenants' series, each limit's flows sum to its `active`,
and RSS stays flat once the bounded label set is in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_four_thousand_flows_keep_their_series_named_and_memory_flat() -> None:
    command = [sys.executable, "-m", "benchmarks._flow_series_worker", "--flows", "4000"]
    command += ["--per-cycle", "20", "--reader", "prometheus"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout)
    assert run["exports"] == 202
    found = {key: run[key] for key in ("overflow_points", "unnamed_points", "tenant_misses")}
    assert found == {"overflow_points": 0, "unnamed_points": 0, "tenant_misses": 0}
    assert run["sum_mismatches"] == 0
    assert run["bad_exports"] == 0
    # 4 limits x (32 names + default + 5 rank slots + other), the names shared by none.
    assert run["max_flow_series_per_instrument"] <= 4 * 39
    # Generous bounds (before: 8 MiB after the first tenth, and growing with the flows).
    assert run["rss_growth_after_first_tenth_mib"] < 1.0, run["rss_samples"]
    assert run["rss_growth_mib"] < 4.0, run["rss_samples"]
