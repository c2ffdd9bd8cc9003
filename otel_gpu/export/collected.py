"""One SDK collection per publication, kept for whoever writes it out.

Each reader of a MeterProvider makes the SDK run every instrument callback
again. :class:`CollectingReader` collects only when asked (right after a
publication, on the publishing thread) and keeps the result, so that the
Prometheus body and the OTLP push (:mod:`otel_gpu.export.otlp.push`) are
written from one collection of one snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricReader, MetricsData

CUMULATIVE: dict[type, AggregationTemporality] = dict.fromkeys(
    (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter,
     ObservableGauge),
    AggregationTemporality.CUMULATIVE,
)


COLLECT_TIMEOUT_MS = 60_000
"""How long one collection may take before the SDK throws it away. The callbacks
only read the published snapshot, so a slow collection is a starved CPU, not a
hang: the SDK's 10 s would discard a whole node's body (512 GPUs and 5,000
pods on a busy machine) and the next one with it, for good."""


class CollectingReader(MetricReader):
    """A cumulative reader that collects on demand and keeps the latest collection."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality=CUMULATIVE)
        self._latest: MetricsData | None = None
        self._incoming: MetricsData | None = None
        self.keep = False
        """Whether the last collection is kept for :attr:`latest` (set by its consumer, the
        OTLP push; without one, a collection is let go once written)."""
        self._lock = threading.Lock()
        self.collections = 0
        """How many collections were made through this reader."""
        self._direct: Callable[[], MetricsData | None] | None = None

    def collect_with(self, collect: Callable[[], MetricsData | None]) -> None:
        """Collect through ``collect`` (the provider's
        :class:`~otel_gpu.instrument.direct.DirectCollection`, which makes the SDK's cumulative
        collection without its per-point work) instead of the SDK."""
        self._direct = collect

    def collect_now(self, timeout_millis: float = COLLECT_TIMEOUT_MS) -> MetricsData | None:
        """Collect now; the collection (None while no instrument has a point)."""
        with self._lock:
            if self._direct is not None:
                data = self._direct()
            else:
                self._incoming = None
                self.collect(timeout_millis=timeout_millis)
                data, self._incoming = self._incoming, None
            self._latest = data if self.keep else None
            self.collections += 1
            return data

    @property
    def latest(self) -> MetricsData | None:
        """The last collection, without collecting."""
        return self._latest

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        self._incoming = metrics_data

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Nothing to flush: the collections are pulled."""
