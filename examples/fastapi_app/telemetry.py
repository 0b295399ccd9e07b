"""One SDK MeterProvider (and an optional TracerProvider) built from the standard OTEL_* variables.

    OTEL_METRICS_EXPORTER        comma list of prometheus, otlp, console, none (default prometheus)
    OTEL_TRACES_EXPORTER         comma list of otlp, console, none (default none in this demo)
    OTEL_EXPORTER_OTLP_ENDPOINT  OTLP/HTTP base URL, read by the SDK's OTLP exporters
    OTEL_METRIC_EXPORT_INTERVAL  push interval in ms, read by the SDK's periodic reader
    OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES   read by the SDK's Resource

Every reader and exporter is the SDK's own. Pushing happens on the SDK's background thread and
a Prometheus scrape runs on its own request, so an export failure never reaches a demo request.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from prometheus_client import CollectorRegistry

METRIC_EXPORTERS = frozenset({"prometheus", "otlp", "console", "none"})
TRACE_EXPORTERS = frozenset({"otlp", "console", "none"})
DEFAULT_SERVICE_NAME = "gym-concurrency-demo"


@dataclass
class Telemetry:
    """The providers the app reports through, and the registry `/metrics` serves (if any)."""

    meter_provider: MeterProvider
    tracer_provider: TracerProvider | None
    prometheus_registry: CollectorRegistry | None

    def shutdown(self) -> None:
        """Flush and stop every reader and span processor (pending OTLP points are sent)."""
        self.meter_provider.shutdown()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()


def exporter_names(variable: str, allowed: frozenset[str], default: str) -> list[str]:
    """The exporters listed in `variable`; an unknown one raises ValueError naming it."""
    raw = os.environ.get(variable, "").strip() or default
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    unknown = sorted(set(names) - allowed)
    if unknown:
        raise ValueError(
            f"{variable}: unknown exporter {', '.join(unknown)}; "
            f"expected a comma list of {', '.join(sorted(allowed))}"
        )
    return [name for name in names if name != "none"]


def build_resource() -> Resource:
    """service.name (default demo name) and a service.instance.id unique to this process."""
    attributes: dict[str, str] = {
        SERVICE_INSTANCE_ID: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    }
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = DEFAULT_SERVICE_NAME
    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME over these.
    return Resource.create(attributes)


def _metric_readers(names: list[str]) -> tuple[list[MetricReader], CollectorRegistry | None]:
    readers: list[MetricReader] = []
    registry = None
    for name in names:
        if name == "prometheus":
            from opentelemetry.exporter.prometheus import PrometheusMetricReader

            # A registry of our own: the process-global one would clash across app instances.
            registry = CollectorRegistry(auto_describe=True)
            readers.append(PrometheusMetricReader(registry=registry))
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        else:
            readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    return readers, registry


def _tracer_provider(names: list[str], resource: Resource) -> TracerProvider | None:
    if not names:
        return None
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return provider


def configure_telemetry(*, set_global: bool = True) -> Telemetry:
    """Build the providers from OTEL_* and (by default) install them as the global ones.

    The global MeterProvider is what gym_concurrency's observer and operations report through
    when no provider is passed; it can be set once per process.
    """
    metric_names = exporter_names("OTEL_METRICS_EXPORTER", METRIC_EXPORTERS, "prometheus")
    trace_names = exporter_names("OTEL_TRACES_EXPORTER", TRACE_EXPORTERS, "none")
    resource = build_resource()
    readers, registry = _metric_readers(metric_names)
    # Shut down by the app's lifespan, which flushes the last OTLP points, not at exit.
    meter_provider = MeterProvider(
        resource=resource, metric_readers=readers, shutdown_on_exit=False
    )
    tracer_provider = _tracer_provider(trace_names, resource)
    if set_global:
        metrics.set_meter_provider(meter_provider)
        if tracer_provider is not None:
            trace.set_tracer_provider(tracer_provider)
    return Telemetry(meter_provider, tracer_provider, registry)
