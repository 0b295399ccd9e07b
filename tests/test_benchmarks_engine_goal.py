"""benchmarks/engine_goal.py in a tiny run, as a smoke test: the fake engine, two client
processes released together into one burst (over aiohttp, or httpx given), today's fixed, AIMD
and gradient client limits, each to its row of the summary. The goal itself (<= 6 waiting at
every scrape, >= 0.95 batch utilisation) is not asserted: utilisation needs a quiet machine.
What holds on any machine: every request of the burst completed, the fixed limit of batch /
processes a process never made a request wait at the engine, and utilisation is a fraction.

The engine configuration, before issue 35's wiring is in the tree, stops at once naming what is
missing; once it is, it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._goal_parts import missing_wiring
from benchmarks.engine_goal import parse, settings_for

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--rounds", "1", "--requests", "100", "--processes", "2", "--batch", "16"]
TINY += ["--wait-quiet", "0"]


def run(tmp_path: Path, configs: str, *more: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "benchmarks.engine_goal", "--configs", configs, *TINY, *more]
    command += ["--service-ms", "50", "--json", str(tmp_path / "engine-goal.json")]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)


def test_the_engine_goal_runs_its_baselines(tmp_path: Path) -> None:
    done = run(tmp_path, "fixed,aimd,gradient")
    assert done.returncode == 0, done.stderr[-3000:]
    for config in ("fixed", "aimd", "gradient"):
        assert f"| `{config}` |" in done.stdout
    result = json.loads((tmp_path / "engine-goal.json").read_text())
    assert result["ceiling"] == pytest.approx(100 / (16 * 7), abs=1e-4)  # 6 waves, 4 alone
    for config, row in result["summary"].items():  # no burst passes its ceiling
        assert 0 < row["of_ceiling"] <= 1.0 + 1e-3, config
    cells = result["cells"]
    assert {cell["config"] for cell in cells} == {"fixed", "aimd", "gradient"}
    for cell in cells:
        assert cell["completed"] == cell["served"] == 100, cell["config"]
        assert cell["failed"] == 0
        assert 0 < cell["utilisation"] <= 1.0 + 1e-6, cell["config"]
        assert cell["duration_s"] >= 100 / 16 * 0.05 * 0.9  # the engine's own bound
        if cell["config"] == "fixed":  # 8 a process, 16 in all: the batch, never a queue
            assert cell["max_waiting"] == 0
        assert 0 < cell["client_core_busy"] < 1.5, cell["config"]  # (their one core's share)


def test_the_engine_configuration_says_what_wiring_it_needs(tmp_path: Path) -> None:
    done = run(tmp_path, "engine")
    if missing_wiring(("engine",)):
        assert done.returncode != 0
        assert "engine needs issue 35's wiring: " in done.stderr, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
    else:
        assert done.returncode == 0, done.stderr[-3000:]
        assert "| `engine` |" in done.stdout


def test_the_global_configurations_keep_the_queue_within_waiting_max(tmp_path: Path) -> None:
    """On a redis-server of the run (past its grace period: about 5 s a cell): a global limit
    of batch + 6, and one following the engine with waiting_max 6 for both processes (also
    with each process in a flow of its own)."""
    more = ("--engine-batch-size", "16")
    done = run(tmp_path, "fixed-global,engine-global,engine-global-flows", *more)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = json.loads((tmp_path / "engine-goal.json").read_text())["cells"]
    assert {c["config"] for c in cells} == {"fixed-global", "engine-global", "engine-global-flows"}
    for cell in cells:
        assert cell["completed"] == cell["served"] == 100, cell["config"]
        assert cell["max_waiting"] <= 6, cell["config"]  # at any moment, fleet-wide


def test_a_flows_configuration_is_its_own_with_each_process_in_a_flow_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", ["engine_goal", "--configs", "fixed-global-flows"])
    args, _ = parse()
    urls = ("http://127.0.0.1:1", "redis://127.0.0.1:2/0")
    plain = settings_for("fixed-global", args, *urls)
    flows = settings_for("fixed-global-flows", args, *urls)
    assert flows["clients"][0].pop("flow") == "process"
    assert "flow" not in plain["clients"][0]  # (the default: the request's, none here)
    assert flows == plain  # otherwise the same limit


def test_a_spread_of_run_times_reaches_the_engine_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    done = run(tmp_path, "fixed", "--service-spread", "0.5")
    assert done.returncode == 0, done.stderr[-3000:]
    run_json = json.loads((tmp_path / "engine-goal.json").read_text())
    assert run_json["settings"]["service_spread"] == 0.5
    (cell,) = run_json["cells"]
    assert cell["completed"] == 100
    assert cell["duration_s"] >= 100 / 16 * 0.05 * 0.5 * 0.9  # runs of at least half the time
    refused = run(tmp_path, "fixed", "--service-spread", "1")
    assert refused.returncode != 0
    assert "--service-spread must be in [0, 1)" in refused.stderr


def test_each_configuration_runs_with_each_client_given_a_row_each(tmp_path: Path) -> None:
    """`--clients aiohttp,httpx`: every configuration over both HTTP clients, each its row."""
    done = run(tmp_path, "fixed", "--clients", "aiohttp,httpx")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "engine-goal.json").read_text())
    assert list(result["summary"]) == ["fixed/aiohttp", "fixed/httpx"]
    assert {(c["config"], c["client"]) for c in result["cells"]} == {
        ("fixed", "aiohttp"),
        ("fixed", "httpx"),
    }
    for cell in result["cells"]:
        assert cell["completed"] == cell["served"] == 100, cell["client"]
        assert cell["max_waiting"] == 0, cell["client"]  # 8 a process over either client
    for bad in ("aiohttp,curl", "aiohttp,aiohttp", ""):
        refused = run(tmp_path, "fixed", "--clients", bad)
        assert refused.returncode != 0
        assert "--clients: comma-separated, each once, of aiohttp, httpx" in refused.stderr
