"""benchmarks/flows.py and benchmarks/tokens.py in their --quick mode, as smoke tests: each runs
to its summary, and the figures are sane. The issue's goals are not asserted (CI machines
vary); what is asserted holds on any machine: one FIFO makes the quiet flow wait behind the
flood, nothing is left held, and a limit of the upstream's token capacity, weighted by
`openai_tokens`, never gets a 429."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(module: str, tmp_path: Path, *extra: str) -> tuple[dict[str, Any], str]:
    raw = tmp_path / f"{module}.json"
    command = [sys.executable, "-m", f"benchmarks.{module}", "--quick", "--json", str(raw)]
    done = subprocess.run(
        [*command, *extra], cwd=ROOT, capture_output=True, text=True, timeout=100, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / f"{module}.summary.json").read_text())
    assert raw.exists()
    return summary, done.stdout


def check_flows(summary: dict[str, Any]) -> None:
    assert set(summary) == {"alone", "one-flow", "flows"}
    for config, row in summary.items():
        assert row["quiet_calls"] > 20, (config, row)  # 25/s for 3 s
        assert row["quiet_unfinished"] == 0
        assert 10 <= row["quiet_p50_ms"] <= row["quiet_p99_ms"], (config, row)
    for config in ("one-flow", "flows"):
        assert summary[config]["flood_per_second"] > 50
        assert summary[config]["flood_ratio"] > 0
    # 256 callers ahead in one FIFO: the quiet flow's calls wait behind them.
    assert summary["one-flow"]["quiet_p50_ms"] > summary["alone"]["quiet_p99_ms"]


def test_the_in_process_flows_benchmark_runs(tmp_path: Path) -> None:
    result, stdout = run("flows", tmp_path, "--part", "inprocess")
    summary = result["summary"]["inprocess"]
    check_flows(summary)
    for row in summary.values():
        assert row["leaked_after"] == [{"active": 0, "queue_depth": 0}]
    assert "| flows |" in stdout


def test_the_middleware_flows_benchmark_runs(tmp_path: Path) -> None:
    from gym_concurrency.middleware.settings import RouteLimit

    if "flow" not in RouteLimit.model_fields:
        pytest.skip("this tree's RouteLimit has no flow setting")
    result, _ = run("flows", tmp_path, "--part", "middleware")
    summary = result["summary"]["middleware"]
    check_flows(summary)
    for row in summary.values():
        assert row["other_statuses"] == {}, row  # every answer a 200


def test_the_tokens_benchmark_runs_and_a_weighted_limit_never_overloads(tmp_path: Path) -> None:
    result, stdout = run("tokens", tmp_path)
    summary = result["summary"]
    assert set(summary) == {"count-mean", "count-largest", "weighted", "weighted+backfill"}
    assert (summary["count-mean"]["limit"], summary["count-largest"]["limit"]) == (20, 4)
    for name, row in summary.items():
        assert 0 < row["utilisation"] <= 1.0, (name, row)
        assert row["calls_per_second"] > 0
        assert row["leaked_after"] == [{"active": 0, "queue_depth": 0}]
    # Never more tokens than the capacity in flight, so never a 429 (nor with 4 of the largest),
    # with backfill too.
    for name in ("weighted", "weighted+backfill", "count-largest"):
        assert summary[name]["upstream_429_per_round"] == [0], name
    for name in ("weighted", "weighted+backfill"):
        assert summary[name]["upstream_max_in_flight"] <= 64_000
    assert summary["weighted"]["backfilled_per_second"] == 0
    assert summary["weighted+backfill"]["backfilled_per_second"] > 0
    assert "| weighted (64000) |" in stdout
