"""OTLP metrics: otel-gpu's exporter, with pod identity moved into the Resource.

The OpenTelemetry SDK gives one MeterProvider one Resource. To make each
pod's GPU series arrive as *that pod's* telemetry, :class:`PodResourceExporter`
regroups every export: data points carrying ``k8s.pod.name`` (and namespace
and container) travel in a ``ResourceMetrics`` of their own whose Resource is
the node's plus the pod's attributes (:mod:`otel_gpu.export.otlp.resources`), with
those attributes taken off the points. Everything else stays under the node's
Resource.

Endpoint, headers, TLS and compression are :mod:`otel_gpu.export.otlp.transport`'s,
shared with the logs; the exporter (:mod:`otel_gpu.export.otlp.client`) reads the
standard ``OTEL_EXPORTER_OTLP_*`` variables not set by otel-gpu as the SDK's
exporters read them, and retries as they do.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from otel_gpu._sdk import number_point
from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.otlp.client import OtlpMetricExporter, Target, target, temporality
from otel_gpu.export.otlp.push import OtlpPush, cumulative
from otel_gpu.export.otlp.resources import Key, WorkloadResources
from otel_gpu.export.otlp.transport import (
    RESOURCE,
    OtlpSettings,
    OtlpSetupError,
    resolve,
)
from otel_gpu.instrument.series import SeriesColumns, SeriesData, flat_metrics
from otel_gpu.workload import WORKLOAD_ATTRIBUTES

log = logging.getLogger(__name__)


def validate(settings: OtlpSettings, environ: Mapping[str, str]) -> None:
    """Everything :func:`build_exporter` checks, without building it (for ``check``)."""
    _target(settings, environ)


def _target(settings: OtlpSettings, environ: Mapping[str, str]) -> Target:
    transport = resolve(settings, environ)
    try:
        return target(transport, environ)
    except ValueError as exc:
        raise OtlpSetupError(f"OTLP exporter: {exc}") from None


def build_exporter(settings: OtlpSettings, environ: Mapping[str, str]) -> OtlpMetricExporter:
    """The exporter for the chosen protocol; a bad setting or variable is an
    :class:`~otel_gpu.export.otlp.transport.OtlpSetupError` naming it."""
    where = _target(settings, environ)
    try:
        return OtlpMetricExporter(where, temporality(settings.temporality, environ))
    except Exception as exc:  # noqa: BLE001 - a channel or session not made
        raise OtlpSetupError(
            f"OTLP exporter: {' '.join(str(exc).split()) or exc.__class__.__name__}"
        ) from None


def build_reader(
    settings: OtlpSettings, node: Resource, environ: Mapping[str, str],
    source: CollectingReader | None = None,
) -> MetricReader:
    """The reader pushing over OTLP (interval: setting, else OTEL_METRIC_EXPORT_INTERVAL).

    With a ``source`` and a cumulative exporter, it pushes the source's
    collections (:class:`~otel_gpu.export.otlp.push.OtlpPush`: one SDK collection
    per cycle for Prometheus and OTLP); otherwise, for delta temporality, it is
    the SDK's periodic reader, collecting by itself.
    """
    own = build_exporter(settings, environ)
    preferred = own.temporality
    exporter: MetricExporter = own
    shared = source if source is not None and cumulative(preferred) else None
    if settings.pod_identity == RESOURCE:
        exporter = PodResourceExporter(exporter, node, preferred=preferred)
    if shared is not None:
        return OtlpPush(exporter, shared, interval_s=settings.interval,
                        timeout_s=settings.timeout, environ=environ)
    interval_ms = settings.interval * 1000 if settings.interval is not None else None
    timeout_ms = settings.timeout * 1000 if settings.timeout is not None else None
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=interval_ms, export_timeout_millis=timeout_ms
    )


_NO_ATTRIBUTES: Mapping[str, AttributeValue] = {}

Split = tuple[Key, "dict[str, AttributeValue] | None"]
"""A point's workload key, and its attributes without the workload's (None: no workload)."""


class _Plan:
    """Where each point of a collection goes (kept while a collection with series ids
    keeps its layout): per output Resource, its scopes, and per metric the (metric's
    place, point's place, slot) of each of its points."""

    __slots__ = ("groups", "layout", "order", "out_layout")

    def __init__(self, layout: object, groups: list[tuple[Any, Any, list[tuple[
            Any, str, list[tuple[Any, list[tuple[int, int, int]]]]]]]]) -> None:
        self.layout = layout
        self.out_layout = object()
        self.groups = groups
        distinct = len({resource for resource, _, _ in groups}) == len(groups)
        self.order: list[tuple[int, int]] | None = [
            (m, p) for _, _, scopes in groups for _, _, entries in scopes
            for _, places in entries for m, p, _ in places] if distinct else None
        """Every point's (metric's place, point's place) in the order the request holds them
        (None where two groups share a Resource: the request merges them)."""


class PodResourceExporter(MetricExporter):
    """Sends each pod's (and each HPC job's) data points under a Resource naming it."""

    def __init__(
        self, inner: MetricExporter, node: Resource, keys: Sequence[str] = WORKLOAD_ATTRIBUTES,
        *, preferred: Mapping[type, AggregationTemporality] | None = None,
    ) -> None:
        """``preferred``: the inner exporter's temporality, which a reader reads off this one."""
        super().__init__(preferred_temporality=None if preferred is None else dict(preferred))
        self._inner = inner
        self._node = node
        self._workloads = WorkloadResources(keys)
        self._splits = SeriesColumns()
        """Each series' :data:`Split`, by series id: the same series push after push."""
        self._plan: _Plan | None = None

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        """The regrouped data exported; while a collection's layout stays, the last request
        is refilled with its points' values in the plan's order instead, no data made."""
        plan = self._plan
        if isinstance(self._inner, OtlpMetricExporter) and isinstance(metrics_data, SeriesData) \
                and plan is not None and plan.layout is metrics_data.layout \
                and plan.order is not None:
            metrics = list(flat_metrics(metrics_data))
            sent = self._inner.export_again(
                plan.out_layout, [metrics[m].data.data_points[p] for m, p in plan.order],
                timeout_millis)
            if sent is not None:
                return sent
        return self._inner.export(self.regroup(metrics_data), timeout_millis=timeout_millis)

    def _split(self, attrs: Mapping[str, AttributeValue]) -> Split:
        key = self._workloads.key(attrs)
        if not key:
            return (), None
        return key, self._workloads.strip(attrs)

    def regroup(self, data: MetricsData) -> MetricsData:
        """``data`` with each workload's points under its Resource, node first. A
        collection with series ids is regrouped by a plan kept while its layout stays, and
        keeps its ids (of the points' series, their attributes now without the workload);
        any other is planned afresh, each point its own slot."""
        if isinstance(data, SeriesData) and data.table is not None:
            splits = self._splits.of(data)
            plan = self._plan
            if plan is None or plan.layout is not data.layout:
                plan = self._plan = self._make_plan(data, data.layout, iter(data.ids), splits)
            out, ids = self._apply(plan, data, splits)
            return SeriesData(resource_metrics=out, ids=ids, layout=plan.out_layout,
                              table=data.table)
        sizes = [len(m.data.data_points) for m in flat_metrics(data)]
        firsts = list(itertools.accumulate(sizes, initial=0))[:-1]
        slots = [tuple(range(first, first + n)) for first, n in zip(firsts, sizes, strict=True)]
        slotted: list[Any] = [None] * sum(sizes)
        out, _ = self._apply(self._make_plan(data, None, iter(slots), slotted), data, slotted)
        return MetricsData(resource_metrics=out)

    def _apply(self, plan: _Plan, data: MetricsData, splits: list[Any]
               ) -> tuple[list[ResourceMetrics], list[tuple[int, ...]]]:
        """The plan's Resources filled with ``data``'s points, and each metric's slots."""
        metrics = list(flat_metrics(data))
        out: list[ResourceMetrics] = []
        ids: list[tuple[int, ...]] = []
        for resource, schema_url, scopes in plan.groups:
            scope_metrics = []
            for scope, scope_schema, entries in scopes:
                made = []
                for first, places in entries:
                    points = []
                    for m, p, slot in places:
                        point = metrics[m].data.data_points[p]
                        stripped = splits[slot][1]
                        if stripped is not None:
                            point = replace(point, attributes=stripped) if point.exemplars \
                                else number_point(stripped, point.start_time_unix_nano,
                                                  point.time_unix_nano, point.value)
                        points.append(point)
                    made.append(_with_points(metrics[first], points))
                    ids.append(tuple(slot for _, _, slot in places))
                scope_metrics.append(ScopeMetrics(scope=scope, metrics=made,
                                                  schema_url=scope_schema))
            out.append(ResourceMetrics(resource, scope_metrics, schema_url))
        return out, ids

    def _make_plan(self, data: MetricsData, layout: object,
                   slots: Iterator[tuple[int, ...]], splits: list[Any]) -> _Plan:
        """Where each point goes: ``slots`` gives each metric's points their slots in
        ``splits`` (a series' id, or the point's place), whose empty ones are filled."""
        groups_out: list[tuple[Any, Any, list[Any]]] = []
        m = 0
        for rm in data.resource_metrics:
            # pod key -> (scope, schema) -> metric name -> (first metric's place, points)
            groups: dict[Key, dict[Any, dict[str, tuple[int, list[tuple[int, int, int]]]]]] = {}
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    points: Sequence[Any] = metric.data.data_points
                    for p, (point, slot) in enumerate(zip(points, next(slots), strict=True)):
                        split = splits[slot]
                        if split is None:
                            split = splits[slot] = self._split(
                                point.attributes or _NO_ATTRIBUTES)
                        scopes = groups.setdefault(split[0], {})
                        by_name = scopes.setdefault((sm.scope, sm.schema_url), {})
                        by_name.setdefault(metric.name, (m, []))[1].append((m, p, slot))
                    m += 1
            for key, scopes in groups.items():
                resource = self._workloads.resource(rm.resource, key)
                groups_out.append((resource, rm.schema_url, [
                    (scope, schema_url, list(by_name.values()))
                    for (scope, schema_url), by_name in scopes.items()]))
        # node first, then pods in a stable order
        keys = self._workloads.keys
        groups_out.sort(key=lambda g: tuple(str(g[0].attributes.get(k, "")) for k in keys))
        return _Plan(layout, groups_out)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)


def _with_points(metric: Any, points: list[Any]) -> Any:
    """``metric`` with other points (what ``dataclasses.replace`` makes, without its
    per-call field walk)."""
    data = metric.data
    if isinstance(data, Sum):
        data = Sum(data_points=points, aggregation_temporality=data.aggregation_temporality,
                   is_monotonic=data.is_monotonic)
    elif isinstance(data, Gauge):
        data = Gauge(data_points=points)
    else:
        data = replace(data, data_points=points)
    return Metric(name=metric.name, description=metric.description, unit=metric.unit,
                  data=data)
