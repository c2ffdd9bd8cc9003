"""Exporter doubles: SDK metric and log exporters that keep what they are handed, and the
SDK's own OTLP exporters aimed at a test receiver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_gpu.export.collected import CUMULATIVE
from otel_gpu.export.otlp.client import Attempt
from testkit.otlp_receiver import OtlpReceiver

Exporter = GrpcMetricExporter | HttpMetricExporter


class RecordingExporter(MetricExporter):
    """Keeps what it is given (cumulative); fails while ``failing`` is set."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality=CUMULATIVE)
        self.exported: list[MetricsData] = []
        self.failing = False
        self.shut = False

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        if self.failing:
            raise ConnectionError("backend\nunreachable")
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.shut = True


class CapturingSender:
    """An OTLP exporter's sender (:class:`otel_gpu.export.otlp.client.Sender`) that keeps
    each request's bytes and answers every send as accepted."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def prepare(self, body: bytes) -> bytes:
        return body

    def send(self, body: bytes, timeout_s: float) -> Attempt:
        self.sent.append(body)
        return Attempt(True)

    def reconnect(self) -> None:
        pass

    def close(self) -> None:
        pass


class RecordingLogExporter(LogRecordExporter):
    """Keeps each batch of log records it is given."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        self.batches.append(list(batch))
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class SdkExporters:
    """Builds SDK exporters aimed at a receiver and shuts them all down afterwards."""

    def __init__(self) -> None:
        self._made: list[Exporter] = []

    def grpc(self, rx: OtlpReceiver | None = None, **kwargs: Any) -> GrpcMetricExporter:
        if rx is not None:
            kwargs.setdefault("endpoint", rx.grpc_endpoint)
        kwargs.setdefault("timeout", 3)
        exporter = GrpcMetricExporter(**kwargs)
        self._made.append(exporter)
        return exporter

    def http(self, rx: OtlpReceiver | None = None, **kwargs: Any) -> HttpMetricExporter:
        if rx is not None:
            kwargs.setdefault("endpoint", rx.http_metrics_url)
        kwargs.setdefault("timeout", 3)
        exporter = HttpMetricExporter(**kwargs)
        self._made.append(exporter)
        return exporter

    def make(self, transport: str, rx: OtlpReceiver, **kwargs: Any) -> Exporter:
        return self.grpc(rx, **kwargs) if transport == "grpc" else self.http(rx, **kwargs)

    def shutdown(self) -> None:
        for exporter in self._made:
            exporter.shutdown()


class WrittenBody:
    """An exposition written the same in every style (a render cache's source in tests)."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def write(self, style: object) -> bytes:
        return self.body
