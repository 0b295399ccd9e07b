"""`benchmarks.shared_cost --analyze`: where a shared limit's cost goes.

- cProfile of the client process in one uncontended and one contended (one process, 64 tasks
  over 8) run: the top 15 functions by tottime, and the tottime split by where the code lives
  (redis-py, asyncio / uvloop, gym_concurrency, the rest);
- MONITOR during a short uncontended and a short contended run: per script (named by the
  SHA1 of the measured tree's scripts), its calls per admission and the Redis commands one
  call runs on average; and the commands sent outside scripts (the mailbox's BLPOP).
  MONITOR slows Redis: these runs give counts, never times.
"""

from __future__ import annotations

import contextlib
import io
import pstats
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks._shared_cost_redis import LocalRedis, script_names

__all__ = ["analyze"]

TOP = 15
PLACES = (
    ("redis-py", ("/redis/",)),
    ("hiredis", ("hiredis",)),
    ("asyncio", ("/asyncio/", "<built-in method select", "_asyncio", "_contextvars")),
    ("uvloop", ("uvloop",)),
    ("gym_concurrency", ("gym_concurrency",)),
    ("worker", ("_shared_cost_worker",)),
)


def _place(filename: str, name: str) -> str:
    where = f"{filename}:{name}"
    for place, marks in PLACES:
        if any(mark in where for mark in marks):
            return place
    return "other"


def _profile_report(path: str) -> dict[str, Any]:
    stats = pstats.Stats(path)
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    places: dict[str, float] = {}
    for (filename, _, name), row in stats.stats.items():  # type: ignore[attr-defined]
        place = _place(filename, name)
        places[place] = places.get(place, 0.0) + row[2]
    text = io.StringIO()
    stats.stream = text  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(TOP)
    lines = [line for line in text.getvalue().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return {
        "total_tottime_s": round(total, 3),
        "share_by_place": {
            k: round(v / total, 3) for k, v in sorted(places.items(), key=lambda kv: -kv[1])
        },
        "top_by_tottime": lines[start : start + TOP + 1],
    }


def _monitored(
    redis: LocalRedis, library: Path, mode: str, admissions: int, measure: Callable[..., Any]
) -> dict[str, Any]:
    names = script_names(library)
    found: dict[str, Any] = {}

    @contextlib.contextmanager
    def monitored() -> Iterator[None]:
        with redis.monitor(names) as seen:
            yield
        found.update(seen)

    row = measure(
        redis, library, "shared", mode, admissions=admissions, key=f"mon-{mode}", around=monitored
    )
    count = row["admissions"]
    scripts: dict[str, Any] = {}
    for name, entry in found.items():
        if name == "other":
            continue
        calls = entry["calls"]
        scripts[name] = {
            "calls_per_admission": round(calls / count, 3),
            "commands_per_call": round(sum(entry["commands"].values()) / calls, 1),
            "commands_per_admission": round(sum(entry["commands"].values()) / count, 2),
            "by_command_per_call": {
                k: round(v / calls, 2) for k, v in entry["commands"].most_common()
            },
        }
    other = {k: round(v / count, 3) for k, v in found["other"].most_common()}
    return {"admissions": count, "scripts": scripts, "outside_scripts_per_admission": other}


def analyze(
    redis: LocalRedis, library: Path, admissions: int, measure: Callable[..., Any]
) -> dict[str, Any]:
    result: dict[str, Any] = {"profile": {}, "monitor": {}}
    with tempfile.TemporaryDirectory() as folder:
        for mode in ("uncontended", "contended"):
            path = str(Path(folder) / f"{mode}.prof")
            row = measure(
                redis,
                library,
                "shared",
                mode,
                admissions=admissions,
                key=f"prof-{mode}",
                profile=path,
            )
            report = _profile_report(f"{path}.0")
            report["client_cpu_us_profiled"] = round(row["client_cpu_us"], 1)
            result["profile"][mode] = report
    for mode in ("uncontended", "contended"):
        result["monitor"][mode] = _monitored(redis, library, mode, 300, measure)
    result["report"] = _text(result)
    return result


def _text(result: dict[str, Any]) -> str:
    out = []
    for mode, report in result["profile"].items():
        out.append(
            f"## cProfile, {mode} (client CPU under the profiler: "
            f"{report['client_cpu_us_profiled']} us/admission)"
        )
        out.append(
            "tottime by place: "
            + ", ".join(f"{k} {v:.0%}" for k, v in report["share_by_place"].items())
        )
        out.extend(report["top_by_tottime"])
        out.append("")
    for mode, found in result["monitor"].items():
        out.append(f"## Redis commands by script, {mode} ({found['admissions']} admissions)")
        for name, entry in found["scripts"].items():
            top = ", ".join(f"{k} {v}" for k, v in list(entry["by_command_per_call"].items())[:8])
            out.append(
                f"{name}: {entry['calls_per_admission']} calls/admission x "
                f"{entry['commands_per_call']} commands = {entry['commands_per_admission']} "
                f"per admission ({top})"
            )
        out.append(f"outside scripts, per admission: {found['outside_scripts_per_admission']}")
        out.append("")
    return "\n".join(out)
