"""Ratio timing: cases run interleaved in rounds in one process, each against a baseline.

A case is `run(n) -> elapsed ns` (sync or async): it does n operations and times only them
with `perf_counter_ns`, so set-up and tear-down stay outside the figure. The harness sizes
each case's n so that its round lasts at least `min_round_ns`, warms each case up, then
runs the rounds as A, B, A, B, ... with a full `gc.collect()` before and the collector
disabled during each run. It reports per case the median time per operation and the median
(and range) of its per-round ratio to the baseline's time per operation in the same round,
which cancels drift that a round shares.
"""

from __future__ import annotations

import gc
import inspect
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "Case",
    "Comparison",
    "Settings",
    "compare",
    "format_ns",
    "markdown_table",
    "now_ns",
]

now_ns = time.perf_counter_ns

Run = Callable[[int], "int | Awaitable[int]"]


@dataclass(frozen=True)
class Case:
    """One contender: `run(n)` does n operations and returns the ns they took."""

    name: str
    run: Run


@dataclass(frozen=True)
class Settings:
    """How long and how often to measure."""

    rounds: int = 15
    min_round_ns: int = 200_000_000  # 0.2 s per case per round
    warmup_rounds: int = 1
    max_n: int = 10_000_000

    @classmethod
    def quick(cls) -> Settings:
        """A smoke-test pass: few short rounds; figures are indicative only."""
        return cls(rounds=5, min_round_ns=30_000_000)


@dataclass(frozen=True)
class Comparison:
    """The outcome of one interleaved comparison. `per_op_ns[name]` holds one value a round."""

    title: str
    unit: str
    n: dict[str, int]
    baseline: str
    per_op_ns: dict[str, list[float]]
    ratios: dict[str, list[float]]

    def median_ns(self, name: str) -> float:
        """Median time per operation of `name` over the rounds."""
        return statistics.median(self.per_op_ns[name])

    def ratio(self, name: str) -> float:
        """Median over rounds of (time of `name`) / (time of the baseline) in the same round."""
        return statistics.median(self.ratios[name])

    def to_json(self) -> dict[str, object]:
        """The raw figures, for `--json` output."""
        return {
            "title": self.title,
            "unit": self.unit,
            "baseline": self.baseline,
            "n": self.n,
            "median_ns": {name: self.median_ns(name) for name in self.per_op_ns},
            "ratio": {name: self.ratio(name) for name in self.ratios},
            "per_op_ns": self.per_op_ns,
            "ratios": self.ratios,
        }


async def _call(run: Run, n: int) -> int:
    gc.collect()
    gc.disable()
    try:
        result = run(n)
        if inspect.isawaitable(result):
            result = await result
        return int(result)
    finally:
        gc.enable()


async def _calibrate(case: Case, settings: Settings) -> int:
    n = 1
    while n < settings.max_n:
        elapsed = await _call(case.run, n)
        if elapsed >= settings.min_round_ns:
            return n
        # Aim a little past the target, growing at most 10x a step.
        growth = min(10.0, 1.2 * settings.min_round_ns / max(elapsed, 1))
        n = min(settings.max_n, max(n + 1, int(n * growth)))
    return settings.max_n


async def compare(
    title: str,
    cases: Sequence[Case],
    settings: Settings,
    *,
    unit: str = "op",
) -> Comparison:
    """Time `cases` interleaved; the first case is the baseline every ratio divides by."""
    n = {case.name: await _calibrate(case, settings) for case in cases}
    for _ in range(settings.warmup_rounds):
        for case in cases:
            await _call(case.run, n[case.name])
    per_op: dict[str, list[float]] = {case.name: [] for case in cases}
    ratios: dict[str, list[float]] = {case.name: [] for case in cases}
    for _ in range(settings.rounds):
        round_per_op = [await _call(case.run, n[case.name]) / n[case.name] for case in cases]
        for case, ns in zip(cases, round_per_op, strict=True):
            per_op[case.name].append(ns)
            ratios[case.name].append(ns / round_per_op[0])
    return Comparison(title, unit, n, cases[0].name, per_op, ratios)


def format_ns(ns: float) -> str:
    """A duration in the unit that keeps three significant figures readable."""
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.0f} ns"


def markdown_table(comparison: Comparison, targets: dict[str, float] | None = None) -> str:
    """The comparison as a Markdown table: time per op, ratio to the baseline, target."""
    targets = targets or {}
    lines = [
        f"**{comparison.title}** ({len(comparison.ratios[comparison.baseline])} rounds)",
        "",
        f"| case | {comparison.unit}s a round | median per {comparison.unit} | "
        f"ratio to {comparison.baseline} (median, min-max) | target | met |",
        "| --- | ---: | ---: | ---: | ---: | :---: |",
    ]
    for name, values in comparison.per_op_ns.items():
        ratios = comparison.ratios[name]
        target = targets.get(name)
        ratio = comparison.ratio(name)
        verdict = "| |"
        if target is not None:
            verdict = f"<= {target!r}x | {'yes' if ratio <= target else '**no**'} |"
        lines.append(
            f"| {name} | {comparison.n[name]} | {format_ns(statistics.median(values))} | "
            f"{ratio:.3f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {verdict}"
        )
    return "\n".join(lines)
