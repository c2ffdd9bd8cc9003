"""SDK metrics data built by hand: points, gauges, sums and a whole collection, for the
writers that must encode what the SDK's exporters encode."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

CUMULATIVE, DELTA = AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA


def point(value, attributes=None):
    return NumberDataPoint(attributes=attributes or {}, start_time_unix_nano=1,
                           time_unix_nano=2, value=value)


def gauge(name, points, unit="", description="a gauge"):
    return Metric(name, description, unit, Gauge(points))


def total(name, points, unit="", monotonic=True, temporality=CUMULATIVE, description="a sum"):
    return Metric(name, description, unit, Sum(points, temporality, monotonic))


def data(*metrics, scope=None, resource=None, more=()):
    scope = scope or InstrumentationScope("otel_gpu", "1.2.3")
    resource = resource or Resource({"service.name": "otel-gpu", "host.name": "node-1"})
    rms = [ResourceMetrics(resource, [ScopeMetrics(scope, list(metrics), "")], "")]
    return MetricsData(rms + list(more))
