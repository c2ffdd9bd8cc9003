"""OTLP push from the collection the Prometheus body was written from.

A second reader on the MeterProvider (the SDK's periodic one) would run every
instrument callback again on its own thread, doubling the collector's CPU at
a 10 s export interval, and could straddle a publication. :class:`OtlpPush`
collects nothing by itself while publications keep coming: every interval it
exports the latest collection of a :class:`CollectingReader` (made right after
the publication, for the Prometheus body), and collects one itself only when
none was made since its last push (no Prometheus exporter, or a stuck
sampler, whose growing ``otel_gpu_sample_age_seconds`` must still arrive).

It is registered on the MeterProvider like any reader, so that shutting the
provider down makes the final export, as the SDK's periodic reader does. It
only suits cumulative exporters: a cumulative collection is no delta.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricReader,
    MetricsData,
)

from otel_gpu._log import LogLimiter
from otel_gpu.export.collected import CUMULATIVE, CollectingReader

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 60_000.0
DEFAULT_TIMEOUT_MS = 30_000.0


def _millis(value: float | None, variable: str, environ: Mapping[str, str],
            default: float) -> float:
    """A setting in milliseconds, else the SDK's variable (invalid: the default, as the SDK)."""
    if value is not None:
        return value
    try:
        return float(environ.get(variable, default))
    except ValueError:
        log.warning("%s is not a number of milliseconds; using %g", variable, default)
        return default


def export_interval_ms(interval_s: float | None, environ: Mapping[str, str]) -> float:
    """The push interval in milliseconds: the setting, else OTEL_METRIC_EXPORT_INTERVAL, else
    the SDK's default (what :class:`OtlpPush` and the SDK's periodic reader wait)."""
    return _millis(None if interval_s is None else interval_s * 1000,
                   "OTEL_METRIC_EXPORT_INTERVAL", environ, DEFAULT_INTERVAL_MS)


def cumulative(preferred: Mapping[type, AggregationTemporality]) -> bool:
    """Whether an exporter's temporality is cumulative for every instrument (then it may share
    a collection)."""
    return all(t == AggregationTemporality.CUMULATIVE for t in preferred.values())


class OtlpPush(MetricReader):
    """Exports a :class:`CollectingReader`'s latest collection every interval."""

    def __init__(
        self,
        exporter: MetricExporter,
        source: CollectingReader,
        *,
        interval_s: float | None = None,
        timeout_s: float | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(preferred_temporality=CUMULATIVE)
        env = os.environ if environ is None else environ
        self.source = source
        source.keep = True
        self.fresh: Callable[[], MetricsData | None] = source.collect_now
        """Collects now; the owner of the snapshot may wrap it to pin one snapshot."""
        self._exporter = exporter
        self.interval_ms = export_interval_ms(interval_s, env)
        self.timeout_ms = _millis(None if timeout_s is None else timeout_s * 1000,
                                  "OTEL_METRIC_EXPORT_TIMEOUT", env, DEFAULT_TIMEOUT_MS)
        if self.interval_ms <= 0:
            raise ValueError(f"OTLP export interval {self.interval_ms:g} ms is not positive")
        self._seen = 0
        self._export_lock = threading.Lock()
        self._stop = threading.Event()
        self._done = False
        self._limited = LogLimiter(log, 60.0)
        self.pushes = 0
        """Exports attempted."""
        self.collected = 0
        """Of those, how many collected by themselves (no publication since the last)."""
        self._thread: threading.Thread | None = None
        if self.interval_ms < math.inf:
            self._thread = threading.Thread(target=self._run, name="otel-gpu-otlp", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_ms / 1000):
            self.push()

    def pin_collections(self, pin: Callable[[Callable[[], MetricsData | None]],
                                            Callable[[], MetricsData | None]]) -> None:
        """Have the collections this push makes itself go through ``pin``."""
        self.fresh = pin(self.source.collect_now)

    def push(self, timeout_ms: float | None = None, *, fresh: bool = False) -> None:
        """Export the newest collection, collecting one first if none came since the last push
        (or if ``fresh``)."""
        timeout_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        try:
            with self._export_lock:
                made = self.source.collections
                data = self.source.latest if made != self._seen and not fresh else None
                if data is None:
                    data = self.fresh()
                    self.collected += 1
                self._seen = self.source.collections
                if data is None:
                    return
                self.pushes += 1
                self._exporter.export(data, timeout_millis=timeout_ms)
        except Exception as exc:  # noqa: BLE001 - the push loop outlives any failure
            self._limited.log("push", logging.ERROR, "OTLP export failed: %s: %s",
                              type(exc).__name__, " ".join(str(exc).split()))

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        """Never collected through itself: the source is."""

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        self.push(min(self.timeout_ms, timeout_millis))
        return self._exporter.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Stop the loop, export once more (a fresh collection), shut the exporter down."""
        if self._done:
            return
        self._done = True
        started = time.monotonic()
        deadline = started + timeout_millis / 1000

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        self._stop.set()
        if self._thread is not None:
            self._thread.join(left())
        # The last values, collected now (the sample age as of now), on a thread of their own:
        # an exporter may retry a backend that is down past any timeout it is given.
        final = threading.Thread(target=self.push, args=(min(self.timeout_ms, left() * 1000),),
                                 kwargs={"fresh": True}, name="otel-gpu-otlp-final", daemon=True)
        final.start()
        final.join(left())
        if final.is_alive():
            log.warning("the final OTLP export did not finish in %.1f s (is the backend up?); "
                        "stopping without it", time.monotonic() - started)
        self._exporter.shutdown(timeout_millis=left() * 1000)
