"""OTLP logs: GPU events (:mod:`otel_gpu.export.events.detector`) as OpenTelemetry log records.

The SDK's LoggerProvider, a BatchLogRecordProcessor (bounded queue, its own
export thread) and the SDK's OTLP log exporter, over the transport the metrics
use, to the same place: the ``otlp_*`` settings apply to both signals, and the
variables are read as the SDK reads them (``OTEL_EXPORTER_OTLP_LOGS_*``, else
``OTEL_EXPORTER_OTLP_*``); with neither a logs nor a generic endpoint, logs
follow ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``. ``OTEL_LOGS_EXPORTER=none``
turns logs off. Every setting is checked at start-up by
:mod:`otel_gpu.export.otlp.transport`, the transport the metrics use too.

The SDK's encoder groups records by their ``resource``: :class:`PodResourceLogExporter`
gives each record whose attributes name a pod the node's Resource plus that
pod (:mod:`otel_gpu.export.otlp.resources`, as for the metrics), so an event
arrives beside the pod's metrics. No handler is attached
to Python's logging: the collector's own log lines stay on stderr only.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from opentelemetry.sdk.resources import Resource

from otel_gpu import __version__
from otel_gpu._sdk import (
    BatchLogRecordProcessor,
    LoggerProvider,
    LogRecordExporter,
    LogRecordExportResult,
    ReadableLogRecord,
    SeverityNumber,
    log_exporter_class,
)
from otel_gpu.export.events.records import ERROR, FATAL, INFO, WARN, Event
from otel_gpu.export.otlp.ports import wrong_port
from otel_gpu.export.otlp.resources import Key, WorkloadResources
from otel_gpu.export.otlp.transport import (
    GRPC,
    LOGS,
    RESOURCE,
    OtlpSettings,
    OtlpSetupError,
    Transport,
    resolve,
)
from otel_gpu.workload import WORKLOAD_ATTRIBUTES

log = logging.getLogger(__name__)

SCOPE = "otel_gpu.events"
LOGS_EXPORTER = "OTEL_LOGS_EXPORTER"
MAX_QUEUE = 2048
"""Records waiting for export, at most: past it the SDK drops the oldest (and says so)."""
BATCH = 512
SEVERITY: Mapping[str, SeverityNumber] = {
    FATAL: SeverityNumber.FATAL, ERROR: SeverityNumber.ERROR,
    WARN: SeverityNumber.WARN, INFO: SeverityNumber.INFO,
}


def logs_enabled(environ: Mapping[str, str]) -> bool:
    """``OTEL_LOGS_EXPORTER``: ``otlp`` (the default) or ``none``; anything else is refused."""
    raw = environ.get(LOGS_EXPORTER, "").strip().lower()
    names = {n.strip() for n in raw.split(",") if n.strip()} or {"otlp"}
    if names == {"none"}:
        return False
    unknown = sorted(names - {"otlp", "none"})
    if unknown:
        raise OtlpSetupError(f"{LOGS_EXPORTER}: unsupported exporter {unknown[0]!r}; "
                             "use otlp or none")
    return True


def validate(settings: OtlpSettings, environ: Mapping[str, str]) -> None:
    """Everything :func:`build_event_log` checks, without building it (for ``check``)."""
    if logs_enabled(environ):
        resolve(settings, environ, LOGS)


def build_exporter(settings: OtlpSettings, environ: Mapping[str, str]) -> LogRecordExporter:
    """The SDK's OTLP log exporter for the metrics' transport; a bad setting raises
    :class:`~otel_gpu.export.otlp.transport.OtlpSetupError` naming it."""
    transport = resolve(settings, environ, LOGS)
    url = (transport.endpoint or environ.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
           or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))  # what the SDK's exporter reads
    hint = wrong_port(transport.protocol, url, "logs")
    if hint is not None:
        log.warning("OTLP logs: %s", hint)
    try:
        return _sdk_exporter(transport)
    except Exception as exc:  # noqa: BLE001 - the SDK reads OTEL_* variables here, may refuse
        raise OtlpSetupError(
            f"OTLP log exporter: {' '.join(str(exc).split()) or exc.__class__.__name__}"
        ) from None


def _sdk_exporter(transport: Transport) -> LogRecordExporter:
    if transport.protocol == GRPC:
        return log_exporter_class("grpc")(**transport.grpc_arguments())
    return log_exporter_class("http")(**transport.http_arguments())


class PodResourceLogExporter(LogRecordExporter):
    """Sends each record naming a pod (or an HPC job) under the node's Resource plus it.

    The SDK's encoder makes one ``ResourceLogs`` per distinct ``resource`` of
    the records in a batch; this sets each record's, and takes the pod
    attributes off the record.
    """

    def __init__(self, inner: LogRecordExporter, node: Resource,
                 keys: Sequence[str] = WORKLOAD_ATTRIBUTES) -> None:
        self._inner = inner
        self._node = node
        self._workloads = WorkloadResources(keys)

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        return self._inner.export(self.regroup(batch))

    def regroup(self, batch: Sequence[ReadableLogRecord]) -> list[ReadableLogRecord]:
        out = []
        for record in batch:
            attrs = record.log_record.attributes or {}
            key: Key = self._workloads.key(attrs)
            if not key:
                out.append(replace(record, resource=self._node))
                continue
            inner = copy.copy(record.log_record)
            inner.attributes = self._workloads.strip(attrs)
            out.append(replace(record, log_record=inner,
                               resource=self._workloads.resource(self._node, key)))
        return out

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._inner.shutdown()


class EventLog:
    """Where events go: one LoggerProvider with one batch processor, shut down once."""

    def __init__(self, exporter: LogRecordExporter, node: Resource, *,
                 max_queue: int = MAX_QUEUE, schedule_delay_ms: float = 1000.0) -> None:
        self.provider = LoggerProvider(resource=node, shutdown_on_exit=False)
        self.provider.add_log_record_processor(BatchLogRecordProcessor(
            exporter, schedule_delay_millis=schedule_delay_ms,
            max_export_batch_size=min(BATCH, max_queue), max_queue_size=max_queue))
        self._logger = self.provider.get_logger(SCOPE, __version__)

    def emit(self, event: Event) -> None:
        """Queue one record (never blocks on the backend)."""
        self._logger.emit(
            timestamp=int(event.time * 1e9),
            observed_timestamp=time.time_ns(),
            severity_number=SEVERITY.get(event.severity, SeverityNumber.UNSPECIFIED),
            severity_text=event.severity,
            body=event.body,
            attributes=dict(event.attributes),  # type: ignore[arg-type]
            event_name=event.name,
        )

    def start_shutdown(self) -> threading.Thread:
        """Export what is queued and stop, on a thread of its own (a stuck backend must not
        hold the process): join it as long as the caller can wait."""
        stopping = threading.Thread(target=self.provider.shutdown, name="otel-gpu-logs-stop",
                                    daemon=True)
        stopping.start()
        return stopping

    def shutdown(self, timeout_s: float) -> bool:
        """Export what is queued and stop, within ``timeout_s``; whether it finished."""
        stopping = self.start_shutdown()
        stopping.join(timeout_s)
        return not stopping.is_alive()


def build_event_log(settings: OtlpSettings, node: Resource,
                    environ: Mapping[str, str]) -> EventLog | None:
    """The events' logs pipeline, or ``None`` when ``OTEL_LOGS_EXPORTER`` is ``none``."""
    if not logs_enabled(environ):
        log.info("%s=none: GPU events are not sent", LOGS_EXPORTER)
        return None
    exporter: LogRecordExporter = build_exporter(settings, environ)
    if settings.pod_identity == RESOURCE:
        exporter = PodResourceLogExporter(exporter, node)
    return EventLog(exporter, node)

