"""Admission that follows a self-hosted engine's own load: its /metrics (exposition.py), the
gauges each engine serves (gauges.py), fetched (fetch.py) by one poller per URL (poller.py)
for every EngineSignal that follows it (signal.py)."""

from .exposition import DEFAULT_MAX_BYTES
from .fetch import Fetch, ScrapeError, fetch_metrics
from .gauges import (
    ENGINES,
    SGLANG,
    TRITON_TRTLLM,
    TRTLLM_SERVE,
    VLLM,
    EngineLoad,
    EngineMetrics,
    Gauge,
    read_load,
)
from .signal import EngineSignal, EngineStatistics

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENGINES",
    "SGLANG",
    "TRITON_TRTLLM",
    "TRTLLM_SERVE",
    "VLLM",
    "EngineLoad",
    "EngineMetrics",
    "EngineSignal",
    "EngineStatistics",
    "Fetch",
    "Gauge",
    "ScrapeError",
    "fetch_metrics",
    "read_load",
]
