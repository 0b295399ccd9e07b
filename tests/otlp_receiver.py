"""An OTLP/HTTP endpoint for tests: it answers every export and decodes the real protobuf of
each metrics export it is sent, so a test reads what an exporter sent, resource included."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

__all__ = ["OtlpReceiver", "Point"]


@dataclass(frozen=True)
class Point:
    """One data point received: its resource's attributes, its own, and the point."""

    resource: dict[str, Any]
    attributes: dict[str, Any]
    point: Any

    @property
    def value(self) -> float:
        """A gauge's or a sum's value, int or double."""
        return float(self.point.as_int or self.point.as_double)


class OtlpReceiver:
    """An OTLP/HTTP endpoint on a free port of 127.0.0.1 (`url`), for `with` or start/stop."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.paths.append(self.path)
                if self.path == "/v1/metrics":
                    receiver.requests.append(ExportMetricsServiceRequest.FromString(body))
                answer = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def series(self, name: str) -> list[Point]:
        """Every point of metric `name` received so far, in the order received."""
        return [point for metric, point in self._all() if metric == name]

    def points(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """metric name -> (attributes, data point) for every point received so far."""
        found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        for metric, point in self._all():
            found.setdefault(metric, []).append((point.attributes, point.point))
        return found

    def resources(self) -> list[dict[str, Any]]:
        return [
            attributes(rm.resource.attributes)
            for request in list(self.requests)
            for rm in request.resource_metrics
        ]

    def limits(self) -> dict[str, float]:
        """The last gym.concurrency.limit point per limit name."""
        return {
            point.attributes["nemo.gym.concurrency.limit_name"]: point.value
            for point in self.series("gym.concurrency.limit")
        }

    def _all(self) -> list[tuple[str, Point]]:
        found = []
        for request in list(self.requests):
            for resource_metrics in request.resource_metrics:
                resource = attributes(resource_metrics.resource.attributes)
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            found.append(
                                (metric.name, Point(resource, attributes(point.attributes), point))
                            )
        return found


def attributes(key_values: Any) -> dict[str, Any]:
    """OTLP key-values as a dict of plain values."""
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in key_values}
