"""benchmarks/outbound_flows.py in its --quick mode, as a smoke test: it runs to its summary
(two uvicorn processes, one round of both configurations, ~25 s) and the figures are sane.
That the quiet tenant's calls go in its own flow is asserted by
tests/clients/test_route_flow_outbound.py, with generous bounds; here only what holds on any
machine: both tenants were served, and the client limit was kept full."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_outbound_flows_benchmark_runs(tmp_path: Path) -> None:
    raw = tmp_path / "outbound-flows.json"
    command = [sys.executable, "-m", "benchmarks.outbound_flows", "--quick", "--json", str(raw)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| `route` |" in done.stdout
    assert "| `none` |" in done.stdout
    summary = json.loads((tmp_path / "outbound-flows.summary.json").read_text())["summary"]
    cells = json.loads(raw.read_text())["cells"]
    assert {cell["config"] for cell in cells} == {"route", "none"}
    for config, row in summary.items():
        assert 100 <= row["alone_p50_ms"] < 1000, (config, row)  # the upstream takes 100 ms
        assert row["quiet_calls"] >= 1, (config, row)
        # 4 slots of 100 ms: at most 40 calls a second, and the flood keeps them busy.
        assert 20 <= row["calls_per_second"] <= 42, (config, row)
