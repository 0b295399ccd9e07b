"""Core benchmarks: MeteredSemaphore, resources_operation and the observer, as ratios.

Run `python -m benchmarks.core` (or `python benchmarks/core.py`) from the project root;
`--quick` for a smoke pass, `--only NAME` for one benchmark, `--json PATH` for raw figures,
`--baseline PATH` to time another checkout's library beside this one (before / after).
Every figure is a ratio to a baseline timed in the same process, in interleaved rounds
(see benchmarks/_timing.py). The global MeterProvider is never set here, so
`resources_operation` without `meter_provider` is on its disabled path; the exporting
benchmark passes an SDK provider explicitly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._baseline import load as load_baseline
from benchmarks._timing import (
    Case,
    Comparison,
    Settings,
    compare,
    format_ns,
    markdown_table,
    now_ns,
)
from gym_concurrency import MeteredSemaphore, names, observe_concurrency, resources_operation

SemaphoreFactory = Callable[[int], asyncio.BoundedSemaphore]

OPERATION, EXECUTOR = "verify", "inline"
# Equal to the dicts resources_operation records with (it keeps its own prebuilt copies).
QUEUE_ATTRIBUTES = {names.OPERATION_ATTRIBUTE: OPERATION, names.EXECUTOR_ATTRIBUTE: EXECUTOR}
DURATION_ATTRIBUTES = {**QUEUE_ATTRIBUTES, names.OUTCOME_ATTRIBUTE: "ok"}


def stdlib(value: int) -> asyncio.BoundedSemaphore:
    """The baseline semaphore."""
    return asyncio.BoundedSemaphore(value)


def metered(value: int) -> asyncio.BoundedSemaphore:
    """The semaphore under test (unnamed: acquire never looks at the observer anyway)."""
    return MeteredSemaphore(value)


# --- 1. uncontended and contended `async with` ----------------------------------------------


def uncontended(factory: SemaphoreFactory) -> Callable[[int], Awaitable[int]]:
    """n `async with sem: pass` in one task: every acquire finds a free slot."""

    async def run(n: int) -> int:
        sem = factory(1)
        started = now_ns()
        for _ in range(n):
            async with sem:
                pass
        return now_ns() - started

    return run


def contended(
    factory: SemaphoreFactory, limit: int = 8, tasks: int = 64
) -> Callable[[int], Awaitable[int]]:
    """`tasks` tasks share n `async with sem: await asyncio.sleep(0)` on `limit` slots."""

    async def run(n: int) -> int:
        sem = factory(limit)

        async def worker(count: int) -> None:
            for _ in range(count):
                async with sem:
                    await asyncio.sleep(0)

        share, extra = divmod(n, tasks)
        workers = [asyncio.ensure_future(worker(share + (i < extra))) for i in range(tasks)]
        started = now_ns()
        await asyncio.gather(*workers)
        return now_ns() - started

    return run


# --- 2. handoff with a deep queue -----------------------------------------------------------


@dataclass
class _Cycle:
    target: int
    done: asyncio.Future[None]
    count: int = 0
    stop: bool = False


def handoff(factory: SemaphoreFactory, waiters: int) -> Callable[[int], Awaitable[int]]:
    """n releases of a one-slot semaphore, each handing the slot to the head of a queue that
    holds `waiters` tasks throughout (the released task queues again at the tail)."""

    async def run(n: int) -> int:
        sem = factory(1)
        state = _Cycle(n, asyncio.get_running_loop().create_future())

        async def cycle() -> None:
            while True:
                await sem.acquire()
                if state.stop:
                    sem.release()
                    return
                state.count += 1
                if state.count == state.target:
                    state.done.set_result(None)
                sem.release()

        await sem.acquire()
        tasks = [asyncio.ensure_future(cycle()) for _ in range(waiters)]
        await asyncio.sleep(0)  # every task runs once and queues
        started = now_ns()
        sem.release()
        await state.done
        elapsed = now_ns() - started
        # Drain by handing the slot down the queue: cancelling 20,000 stdlib waiters would
        # cost O(waiters) each in deque.remove.
        state.stop = True
        await asyncio.gather(*tasks)
        return elapsed

    return run


# --- 3. and 4. resources_operation ----------------------------------------------------------


def bare(sem: asyncio.BoundedSemaphore) -> Callable[[int], Awaitable[int]]:
    """n `async with sem: await asyncio.sleep(0)`: the guarded body awaits once."""

    async def run(n: int) -> int:
        started = now_ns()
        for _ in range(n):
            async with sem:
                await asyncio.sleep(0)
        return now_ns() - started

    return run


def operation(
    sem: asyncio.BoundedSemaphore, meter_provider: Any = None, wrap: Any = resources_operation
) -> Callable[[int], Awaitable[int]]:
    """The same through `resources_operation` (disabled unless `meter_provider` exports);
    `wrap` is another tree's `resources_operation`, for a baseline."""

    async def run(n: int) -> int:
        started = now_ns()
        for _ in range(n):
            async with wrap(sem, OPERATION, EXECUTOR, meter_provider=meter_provider):
                await asyncio.sleep(0)
        return now_ns() - started

    return run


class _Delegate:
    """The least any wrapper can be: one object whose enter and exit delegate to the limit."""

    __slots__ = ("_limit",)

    def __init__(self, limit: asyncio.BoundedSemaphore) -> None:
        self._limit = limit

    async def __aenter__(self) -> _Delegate:
        await self._limit.__aenter__()
        return self

    def __aexit__(self, *exc_info: Any) -> Awaitable[None]:
        return self._limit.__aexit__(*exc_info)


def delegate(sem: asyncio.BoundedSemaphore) -> Callable[[int], Awaitable[int]]:
    """The same through `_Delegate`: what any async context manager wrapper costs at least."""

    async def run(n: int) -> int:
        started = now_ns()
        for _ in range(n):
            async with _Delegate(sem):
                await asyncio.sleep(0)
        return now_ns() - started

    return run


def floor(sem: asyncio.BoundedSemaphore, meter_provider: Any) -> Callable[[int], Awaitable[int]]:
    """The least an exporting operation can cost: a bare `async with` plus the two SDK
    histogram records it must make, with equal attribute dicts (values are constants)."""
    meter = meter_provider.get_meter("benchmarks.floor")
    queue_duration = meter.create_histogram(
        names.QUEUE_DURATION_INSTRUMENT,
        unit=names.MILLISECONDS_UNIT,
        explicit_bucket_boundaries_advisory=names.OPERATION_BOUNDARIES_MS,
    )
    duration = meter.create_histogram(
        names.DURATION_INSTRUMENT,
        unit=names.MILLISECONDS_UNIT,
        explicit_bucket_boundaries_advisory=names.OPERATION_BOUNDARIES_MS,
    )

    async def run(n: int) -> int:
        started = now_ns()
        for _ in range(n):
            async with sem:
                queue_duration.record(0.001, QUEUE_ATTRIBUTES)
                await asyncio.sleep(0)
            duration.record(0.01, DURATION_ATTRIBUTES)
        return now_ns() - started

    return run


def sdk_provider() -> tuple[Any, Any]:
    """An SDK MeterProvider with an in-memory reader (no export thread to perturb timing)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


# --- 5. observer collection -----------------------------------------------------------------


def collection(size: int) -> Callable[[int], int]:
    """n collections of the observer's seven instruments over `size` named semaphores
    (each with a timeout and a max_queue, so all seven report), through its own provider."""
    provider, reader = sdk_provider()
    observe_concurrency(provider)

    def run(n: int) -> int:
        semaphores = [
            MeteredSemaphore(
                4,
                component="bench",
                limit_name=f"limit_{i}",
                server="bench",
                timeout=30,
                max_queue=100,
            )
            for i in range(size)
        ]
        started = now_ns()
        for _ in range(n):
            reader.get_metrics_data()
        elapsed = now_ns() - started
        del semaphores  # the weak registry forgets them before the next size runs
        return elapsed

    return run


# --- the suite ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Benchmark:
    """One comparison: its cases (baseline first) and the ratio targets it is held to."""

    title: str
    unit: str
    cases: Callable[[], list[Case]]
    targets: dict[str, float]


def _exporting_cases() -> list[Case]:
    provider, _ = sdk_provider()
    sem = MeteredSemaphore(1)
    return [Case("floor", floor(sem, provider)), Case("exporting", operation(sem, provider))]


def baseline_cases(key: str, library: Any) -> list[Case]:
    """The cases of benchmark `key` run on `library`, another tree's gym_concurrency."""

    def theirs(value: int) -> asyncio.BoundedSemaphore:
        return library.MeteredSemaphore(value)  # type: ignore[no-any-return]

    if key == "uncontended":
        return [Case("MeteredSemaphore (baseline)", uncontended(theirs))]
    if key == "contended":
        return [Case("MeteredSemaphore (baseline)", contended(theirs))]
    if key == "handoff":
        return [
            Case("Metered (baseline), 200 waiters", handoff(theirs, 200)),
            Case("Metered (baseline), 20,000 waiters", handoff(theirs, 20_000)),
        ]
    if key == "disabled":
        wrap = library.resources_operation
        return [Case("resources_operation (baseline)", operation(theirs(1), wrap=wrap))]
    if key == "exporting":
        provider, _ = sdk_provider()
        wrap = library.resources_operation
        return [Case("exporting (baseline)", operation(theirs(1), provider, wrap))]
    return []


SIZES = (10, 1_000, 10_000)

BENCHMARKS: dict[str, Benchmark] = {
    "uncontended": Benchmark(
        "1a. Uncontended `async with`: MeteredSemaphore vs asyncio.BoundedSemaphore",
        "acquire",
        lambda: [
            Case("BoundedSemaphore", uncontended(stdlib)),
            Case("MeteredSemaphore", uncontended(metered)),
        ],
        {"MeteredSemaphore": 0.6},
    ),
    "contended": Benchmark(
        "1b. Contended: 64 tasks on 8 slots, body awaits once",
        "acquire",
        lambda: [
            Case("BoundedSemaphore", contended(stdlib)),
            Case("MeteredSemaphore", contended(metered)),
        ],
        {"MeteredSemaphore": 1.05},
    ),
    "handoff": Benchmark(
        "2. Handoff per release, 200 vs 20,000 waiters queued",
        "handoff",
        lambda: [
            Case("Metered, 200 waiters", handoff(metered, 200)),
            Case("Metered, 20,000 waiters", handoff(metered, 20_000)),
            Case("Bounded, 200 waiters", handoff(stdlib, 200)),
            Case("Bounded, 20,000 waiters", handoff(stdlib, 20_000)),
        ],
        {"Metered, 20,000 waiters": 1.2},
    ),
    "disabled": Benchmark(
        "3. resources_operation with no SDK provider vs bare `async with`",
        "operation",
        lambda: [
            Case("bare async with", bare(MeteredSemaphore(1))),
            Case("resources_operation (disabled)", operation(MeteredSemaphore(1))),
            Case("delegating wrapper (reference)", delegate(MeteredSemaphore(1))),
        ],
        {"resources_operation (disabled)": 1.25},
    ),
    "exporting": Benchmark(
        "4. resources_operation exporting vs floor (bare + two histogram records)",
        "operation",
        _exporting_cases,
        {"exporting": 1.2},
    ),
    "observer": Benchmark(
        "5. Observer collection (7 instruments, InMemoryMetricReader)",
        "collect",
        lambda: [Case(f"{size} semaphores", collection(size)) for size in SIZES],
        {},
    ),
}


def observer_table(comparison: Comparison) -> str:
    """Collection cost per semaphore, and the marginal cost between sizes (linearity)."""
    lines = [
        "",
        "| semaphores | per collect | per semaphore | marginal per semaphore vs previous size |",
        "| ---: | ---: | ---: | ---: |",
    ]
    previous: tuple[int, float] | None = None
    for size in SIZES:
        ns = comparison.median_ns(f"{size} semaphores")
        marginal = format_ns((ns - previous[1]) / (size - previous[0])) if previous else "-"
        lines.append(f"| {size:,} | {format_ns(ns)} | {format_ns(ns / size)} | {marginal} |")
        previous = (size, ns)
    return "\n".join(lines)


def machine() -> str:
    """One line naming the interpreter and the machine the figures came from."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"Python {platform.python_version()} ({sys.implementation.name}), {platform.system()} "
        f"{platform.release()}, {cpu}, {os.cpu_count()} CPUs, load average {load} at start"
    )


async def main(argv: list[str] | None = None) -> int:
    """Run the chosen benchmarks and print one Markdown table each; exit 1 if a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few short rounds (smoke test)")
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), default=None)
    parser.add_argument("--rounds", type=int, help="rounds per comparison")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--baseline", type=Path, help="a checkout to time beside this tree")
    args = parser.parse_args(argv)
    library = None if args.baseline is None else load_baseline(args.baseline)
    settings = Settings.quick() if args.quick else Settings()
    if args.rounds:
        settings = Settings(rounds=args.rounds, min_round_ns=settings.min_round_ns)
    print(
        f"<!-- {machine()}; rounds={settings.rounds}, "
        f"min round={settings.min_round_ns / 1e6:.0f} ms -->\n",
        flush=True,
    )
    missed = []
    raw = []
    for key in args.only or list(BENCHMARKS):
        bench = BENCHMARKS[key]
        cases = bench.cases()
        if library is not None:
            cases += baseline_cases(key, library)
        comparison = await compare(bench.title, cases, settings, unit=bench.unit)
        print(markdown_table(comparison, bench.targets))
        if key == "observer":
            print(observer_table(comparison))
        print(flush=True)
        missed += [name for name, limit in bench.targets.items() if comparison.ratio(name) > limit]
        raw.append(comparison.to_json())
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "results": raw}, indent=1))
    if missed:
        print(f"targets missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
