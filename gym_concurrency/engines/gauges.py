"""Where an engine says how loaded it is: the gauges of its waiting queue, its KV-cache usage
and (optionally) its running batch, with the names each engine serves them under.

The Gateway API Inference Extension's model-server protocol asks every model server for two
gauges, TotalQueuedRequests and KVCacheUtilization (a fraction), and lists the name each
server gives them; the defaults here are those names:

| engine | waiting | cache usage | running |
| --- | --- | --- | --- |
| `vllm` | `vllm:num_requests_waiting` | `vllm:kv_cache_usage_perc`, else `vllm:gpu_cache_usage_perc` | `vllm:num_requests_running` |
| `sglang` | `sglang:num_queue_reqs` | `sglang:token_usage` | `sglang:num_running_reqs` |
| `trtllm-serve` | `trtllm_num_requests_waiting` | `trtllm_kv_cache_utilization` | `trtllm_num_requests_running` |
| `triton-trtllm` | `nv_trt_llm_request_metrics{request_type="waiting"}` | `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}` | `nv_trt_llm_request_metrics{request_type="scheduled"}` |

vLLM named its cache gauge `vllm:gpu_cache_usage_perc` up to 0.8; 0.9 added
`vllm:kv_cache_usage_perc` and deprecated the old name, which later releases hide (unless
`--show-hidden-metrics-for-version`) and then removed: the new name is read first.
"""  # noqa: E501

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal

from .exposition import DEFAULT_MAX_BYTES, Sample, read_samples, usable

__all__ = [
    "ENGINES",
    "SGLANG",
    "TRITON_TRTLLM",
    "TRTLLM_SERVE",
    "VLLM",
    "EngineLoad",
    "EngineMetrics",
    "Gauge",
    "engine_metrics",
    "read_load",
]

Combine = Literal["sum", "max"]
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True, slots=True)
class Gauge:
    """One number from a scrape: the first of `names` with a usable sample carrying every
    (name, value) of `labels`; its samples that do, combined by `combine`: "sum" (a queue over
    every engine a server runs) or "max" (the fullest engine's cache)."""

    names: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()
    combine: Combine = "sum"

    def __post_init__(self) -> None:
        if not self.names or not all(_is_name(_METRIC_NAME, n) for n in self.names):
            raise ValueError(f"Gauge: names must be Prometheus metric names, not {self.names!r}")
        if not all(_is_label(pair) for pair in self.labels):
            raise ValueError(f"Gauge: labels must be (name, value) strings, not {self.labels!r}")
        if self.combine not in ("sum", "max"):
            raise ValueError(f"Gauge: combine must be 'sum' or 'max', not {self.combine!r}")

    def read(self, samples: Mapping[str, list[Sample]]) -> float | None:
        """The number, or None if no name has a usable sample with the labels."""
        for name in self.names:
            values = [
                s.value for s in samples.get(name, ()) if usable(s.value) and s.has(self.labels)
            ]
            if values:
                return sum(values) if self.combine == "sum" else max(values)
        return None


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """The gauges of one kind of engine: waiting requests, KV-cache usage (a fraction: 1 is
    full) and, if known, running requests."""

    waiting: Gauge
    cache_usage: Gauge
    running: Gauge | None = None

    def gauges(self) -> tuple[Gauge, ...]:
        return tuple(g for g in (self.waiting, self.cache_usage, self.running) if g is not None)

    def names(self) -> frozenset[str]:
        """Every metric name the gauges may read."""
        return frozenset(name for gauge in self.gauges() for name in gauge.names)

    def with_labels(self, **labels: str) -> EngineMetrics:
        """These gauges, reading only the samples that carry `labels` too (e.g. one
        `model_name` of a server that serves several)."""
        added = tuple(labels.items())
        running = self.running
        return EngineMetrics(
            replace(self.waiting, labels=self.waiting.labels + added),
            replace(self.cache_usage, labels=self.cache_usage.labels + added),
            None if running is None else replace(running, labels=running.labels + added),
        )


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one scrape said; None where its gauge was not in it."""

    waiting: float | None
    cache_usage: float | None
    running: float | None


def read_load(
    body: bytes | str, metrics: EngineMetrics, max_bytes: int = DEFAULT_MAX_BYTES
) -> EngineLoad | None:
    """The load `body` (a /metrics exposition) reports; None if it is over `max_bytes`.
    Never raises on what `body` holds."""
    samples = read_samples(body, metrics.names(), max_bytes)
    if samples is None:
        return None
    running = None if metrics.running is None else metrics.running.read(samples)
    return EngineLoad(metrics.waiting.read(samples), metrics.cache_usage.read(samples), running)


def _is_name(pattern: re.Pattern[str], name: object) -> bool:
    return isinstance(name, str) and pattern.fullmatch(name) is not None


def _is_label(pair: object) -> bool:
    return (
        isinstance(pair, tuple)
        and len(pair) == 2
        and _is_name(_LABEL_NAME, pair[0])
        and isinstance(pair[1], str)
    )


def _cache(*names: str, labels: tuple[tuple[str, str], ...] = ()) -> Gauge:
    return Gauge(names, labels, combine="max")  # the fullest engine's cache decides


VLLM: Final = EngineMetrics(
    Gauge(("vllm:num_requests_waiting",)),
    _cache("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    Gauge(("vllm:num_requests_running",)),
)
SGLANG: Final = EngineMetrics(
    Gauge(("sglang:num_queue_reqs",)),
    _cache("sglang:token_usage"),
    Gauge(("sglang:num_running_reqs",)),
)
TRTLLM_SERVE: Final = EngineMetrics(
    Gauge(("trtllm_num_requests_waiting",)),
    _cache("trtllm_kv_cache_utilization"),
    Gauge(("trtllm_num_requests_running",)),
)
TRITON_TRTLLM: Final = EngineMetrics(
    Gauge(("nv_trt_llm_request_metrics",), (("request_type", "waiting"),)),
    _cache("nv_trt_llm_kv_cache_block_metrics", labels=(("kv_cache_block_type", "fraction"),)),
    Gauge(("nv_trt_llm_request_metrics",), (("request_type", "scheduled"),)),
)
ENGINES: Final[Mapping[str, EngineMetrics]] = {
    "vllm": VLLM,
    "sglang": SGLANG,
    "trtllm-serve": TRTLLM_SERVE,
    "triton-trtllm": TRITON_TRTLLM,
}


def engine_metrics(engine: str | EngineMetrics) -> EngineMetrics:
    """`engine`'s gauges: an EngineMetrics as it is, or the defaults of an engine by name."""
    if isinstance(engine, EngineMetrics):
        return engine
    try:
        return ENGINES[engine]
    except (KeyError, TypeError):
        known = ", ".join(ENGINES)
        raise ValueError(f"unknown engine {engine!r}: expected one of {known}") from None
