"""OTLP logs: GPU events (:mod:`otel_gpu.export.events`) as OpenTelemetry log records.

The SDK's LoggerProvider, a BatchLogRecordProcessor (bounded queue, its own
export thread) and the SDK's OTLP log exporter, over the transport the metrics
use, to the same place: the ``otlp_*`` settings apply to both signals, and the
variables are read as the SDK reads them (``OTEL_EXPORTER_OTLP_LOGS_*``, else
``OTEL_EXPORTER_OTLP_*``); with neither a logs nor a generic endpoint, logs
follow ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``. ``OTEL_LOGS_EXPORTER=none``
turns logs off. Every setting is checked here, at start-up, with the checks
of :mod:`otel_gpu.export.otlp`.

The SDK's encoder groups records by their ``resource``: :class:`PodResourceLogExporter`
gives each record whose attributes name a pod the node's Resource plus that
pod, as :class:`~otel_gpu.export.otlp.PodResourceExporter` does for the
metrics, so an event arrives beside the pod's metrics. No handler is attached
to Python's logging: the collector's own log lines stay on stderr only.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from urllib.parse import urlparse

from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
)
from opentelemetry.sdk.resources import Resource

from otel_gpu import __version__
from otel_gpu.export import otlp
from otel_gpu.export.events import ERROR, FATAL, INFO, WARN, Event
from otel_gpu.export.otlp import GRPC, RESOURCE, OtlpSettings, OtlpSetupError
from otel_gpu.instrument.catalog import WORKLOAD_ATTRIBUTES

log = logging.getLogger(__name__)

SCOPE = "otel_gpu.events"
LOGS_EXPORTER = "OTEL_LOGS_EXPORTER"
_LOGS, _METRICS = "OTEL_EXPORTER_OTLP_LOGS_", "OTEL_EXPORTER_OTLP_METRICS_"
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


def logs_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables as the metrics' checks read them, with the logs' values in the
    metrics' names: ``OTEL_EXPORTER_OTLP_LOGS_X`` is checked as the metrics'
    ``OTEL_EXPORTER_OTLP_METRICS_X`` would be, and the metrics-only ones are ignored."""
    out = {k: v for k, v in environ.items() if not k.startswith(_METRICS)}
    for key, value in environ.items():
        if key.startswith(_LOGS):
            out[_METRICS + key.removeprefix(_LOGS)] = value
    return out


def _relabel(exc: OtlpSetupError) -> OtlpSetupError:
    """A check's message naming the logs variable the user actually set."""
    return OtlpSetupError(str(exc).replace(_METRICS, _LOGS))


def _logs_url(url: str) -> str:
    """An OTLP/HTTP URL for logs: ``.../v1/metrics`` becomes ``.../v1/logs``; a base URL
    gets ``/v1/logs``."""
    path = urlparse(url).path.rstrip("/")
    if path.endswith("/v1/logs"):
        return url
    base = url.rstrip("/")
    if path.endswith("/v1/metrics"):
        base = base[: -len("/v1/metrics")]
    return base + "/v1/logs"


def _endpoint(settings: OtlpSettings, environ: Mapping[str, str],
              view: Mapping[str, str], protocol: str) -> str | None:
    """The endpoint for logs: the setting, else the SDK's variables, else the metrics one."""
    if settings.endpoint:
        return _logs_url(settings.endpoint) if protocol != GRPC else settings.endpoint
    if view.get(_METRICS + "ENDPOINT") or view.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None  # the SDK reads them
    metrics = environ.get(_METRICS + "ENDPOINT", "").strip()
    if not metrics:
        return None
    return _logs_url(metrics) if protocol != GRPC else metrics


def validate(settings: OtlpSettings, environ: Mapping[str, str]) -> None:
    """Everything :func:`build_event_log` checks, without building it (for ``check``)."""
    if logs_enabled(environ):
        _resolve(settings, environ)


def build_exporter(settings: OtlpSettings, environ: Mapping[str, str]) -> LogRecordExporter:
    """The SDK's OTLP log exporter for the metrics' transport; a bad setting raises
    :class:`~otel_gpu.export.otlp.OtlpSetupError` naming it."""
    protocol, endpoint, headers, tls, settings = _resolve(settings, environ)
    try:
        return _sdk_exporter(settings, protocol, endpoint, headers, tls)
    except Exception as exc:  # the SDK reads OTEL_* variables of its own here, and may refuse
        raise OtlpSetupError(
            f"OTLP log exporter: {' '.join(str(exc).split()) or exc.__class__.__name__}"
        ) from None


def _resolve(
    settings: OtlpSettings, environ: Mapping[str, str]
) -> tuple[str, str | None, dict[str, str] | None, Mapping[str, bytes], OtlpSettings]:
    """(protocol, endpoint, headers, TLS files, settings) for logs, each checked as the
    metrics' are. With only the metrics' endpoint set, the metrics' variables are used
    throughout, passed to the exporter explicitly (the SDK's would not read them)."""
    view = logs_environ(environ)
    if settings.endpoint or view.get(_METRICS + "ENDPOINT") or view.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            protocol = otlp.resolve_protocol(settings, view)
            otlp._endpoint(settings, view, protocol)
            env_headers = otlp._env_headers(view)
            tls = otlp._load_tls(settings, view, protocol)
            file = otlp.read_headers_file(settings.headers_file) if settings.headers_file else None
        except OtlpSetupError as exc:
            raise _relabel(exc) from None
        headers = {**env_headers, **file} if file is not None else None
        return protocol, _endpoint(settings, environ, view, protocol), headers, tls, settings
    protocol = otlp.resolve_protocol(settings, environ)
    otlp._endpoint(settings, environ, protocol)
    headers = otlp._env_headers(environ)
    if settings.headers_file:
        headers.update(otlp.read_headers_file(settings.headers_file))
    tls = otlp._load_tls(settings, environ, protocol)
    files = {name: path for name, (path, _) in otlp._tls_files(settings, environ).items()}
    settings = replace(settings, **files)
    return protocol, _endpoint(settings, environ, view, protocol), headers, tls, settings


def _sdk_exporter(settings: OtlpSettings, protocol: str, endpoint: str | None,
                  headers: dict[str, str] | None, tls: Mapping[str, bytes]) -> LogRecordExporter:
    compression = settings.compression
    if protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
            OTLPLogExporter as GrpcExporter,
        )

        credentials, grpc_compression = otlp.grpc_transport(settings, tls)
        return GrpcExporter(endpoint=endpoint, insecure=settings.insecure,
                            credentials=credentials, headers=headers, timeout=settings.timeout,
                            compression=grpc_compression)
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpExporter,
    )

    return HttpExporter(
        endpoint=endpoint,
        session=otlp._explicit_ca_session(),
        certificate_file=settings.certificate,
        client_key_file=settings.client_key,
        client_certificate_file=settings.client_certificate,
        headers=headers,
        timeout=settings.timeout,
        compression=Compression(compression) if compression else None,
    )


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
        self._keys = tuple(keys)

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        return self._inner.export(self.regroup(batch))

    def regroup(self, batch: Sequence[ReadableLogRecord]) -> list[ReadableLogRecord]:
        resources: dict[tuple, Resource] = {}
        out = []
        for record in batch:
            attrs = record.log_record.attributes or {}
            key = tuple(attrs.get(k) for k in self._keys)
            if not any(v is not None for v in key):
                out.append(replace(record, resource=self._node))
                continue
            resource = resources.get(key)
            if resource is None:
                pod = {k: v for k, v in zip(self._keys, key, strict=True) if v is not None}
                resource = resources[key] = Resource({**dict(self._node.attributes), **pod},
                                                     self._node.schema_url)
            inner = copy.copy(record.log_record)
            inner.attributes = {k: v for k, v in attrs.items() if k not in self._keys}
            out.append(replace(record, log_record=inner, resource=resource))
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

