"""Naming profiles: the one catalog shown under other exporters' names.

``otel`` is the OpenTelemetry instruments themselves (rendered by the
OpenTelemetry Prometheus exporter). ``dcgm`` and ``kubelet`` are views that
read the same snapshot and write dcgm-exporter's and the old kubelet's
series, for dashboards built on those names. The profiles shape the
Prometheus endpoint only; OTLP always carries the OpenTelemetry names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from otel_gpu.naming.dcgm import DcgmView, parse_collectors, select_fields
from otel_gpu.naming.exposition import Family, render
from otel_gpu.naming.kubelet import KubeletView
from otel_gpu.snapshot import Snapshot

log = logging.getLogger(__name__)

PROFILES = ("otel", "dcgm", "kubelet")


class View(Protocol):
    def families(self, snapshot: Snapshot) -> list[Family]: ...


def build_views(
    profiles: Sequence[str],
    *,
    hostname: str,
    collectors_file: str | None = None,
    hostname_label: str = "Hostname",
    shared_gpu_copies: bool = False,
) -> list[View]:
    """The non-OpenTelemetry views for ``profiles``.

    Raises ``CollectorsError`` for a malformed counters file; fields it names
    that NVML cannot provide are logged once here, with the reason.
    """
    views: list[View] = []
    if "dcgm" in profiles:
        entries = parse_collectors(collectors_file) if collectors_file else None
        fields, problems = select_fields(entries)
        for problem in problems:
            log.warning("dcgm profile: not exported: %s", problem)
        views.append(DcgmView(fields, hostname, hostname_label=hostname_label,
                              shared_gpu_copies=shared_gpu_copies))
    if "kubelet" in profiles:
        views.append(KubeletView())
    return views


def render_views(views: Sequence[View], snapshot: Snapshot | None) -> bytes:
    if snapshot is None or not views:
        return b""
    families: list[Family] = []
    for view in views:
        families.extend(view.families(snapshot))
    return render(families).encode()
