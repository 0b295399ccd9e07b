"""A benchmark run's result: what its JSON starts and ends with, the raw file (every cell) and
its summary written side by side, by default under benchmarks/results/, and the line that
says which of its goals were met (tokens.py, engine_goal.py, rate_budget_goal.py).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks._source import PROJECT_ROOT, describe_tree
from benchmarks.overload import load_average

__all__ = [
    "RESULTS",
    "RunStart",
    "goals_line",
    "run_header",
    "with_outcome",
    "write_and_print",
    "write_results",
]

RESULTS = PROJECT_ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class RunStart:
    """When a run started (monotonic seconds) and the load average then."""

    monotonic: float = field(default_factory=time.monotonic)
    load_average: list[float] = field(default_factory=load_average)


def run_header(benchmark: str, label: str, source: str) -> dict[str, Any]:
    """What a result starts with: the benchmark, the run's label, the date, the Python and the
    tree measured."""
    return {
        "benchmark": benchmark,
        "label": label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "source": describe_tree(Path(source)),
    }


def with_outcome(
    head: dict[str, Any],
    goals: dict[str, Any],
    start: RunStart,
    summary: dict[str, Any],
    verdicts: dict[str, Any],
) -> dict[str, Any]:
    """`head`, then what a result ends with: the goals, the load average at the start and now,
    the seconds since the start, the summary and the verdicts."""
    return {
        **head,
        "goals": goals,
        "load_average_start": start.load_average,
        "load_average_end": load_average(),
        "seconds": round(time.monotonic() - start.monotonic, 1),
        "summary": summary,
        "verdicts": verdicts,
    }


def write_results(
    result: dict[str, Any], cells: Any, chosen: str | None, default_name: str
) -> tuple[Path, Path]:
    """Write `result` with its `cells` to `chosen` (else RESULTS / `default_name`) and `result`
    alone to the .summary.json beside it; both paths."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = Path(chosen) if chosen else RESULTS / default_name
    path.write_text(json.dumps({**result, "cells": cells}, indent=1) + "\n")
    summary_path = path.with_name(path.name.removesuffix(".json") + ".summary.json")
    summary_path.write_text(json.dumps(result, indent=1) + "\n")
    return path, summary_path


def write_and_print(
    result: dict[str, Any], cells: Any, chosen: str | None, default_name: str, table: str
) -> None:
    """`write_results`, then print `table`, the goals line (if there are verdicts) and where
    the files are."""
    path, summary_path = write_results(result, cells, chosen, default_name)
    print()
    print(table)
    if result["verdicts"]:
        print("\n" + goals_line(result["verdicts"]))
    print(f"\nraw: {path}\nsummary: {summary_path}")


def goals_line(verdicts: dict[str, Any]) -> str:
    """The line "goals: a: met, b: MISSED" that says a run's verdicts."""
    return "goals: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in verdicts.items())
