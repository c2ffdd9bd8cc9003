"""Naming profiles: the one catalog shown under other exporters' names.

``otel`` is the OpenTelemetry instruments themselves (rendered by the
OpenTelemetry Prometheus exporter). ``dcgm`` and ``kubelet`` are profiles that
read the same snapshot and write dcgm-exporter's and the old kubelet's
series, for dashboards built on those names. The profiles shape the
Prometheus endpoint only; OTLP always carries the OpenTelemetry names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from otel_gpu.export.naming.exposition import Family, render
from otel_gpu.snapshot import Snapshot

log = logging.getLogger(__name__)

class Profile(Protocol):
    """A set of compatibility series written from one snapshot."""

    def families(self, snapshot: Snapshot) -> list[Family]: ...


def build_profiles(
    names: Sequence[str],
    *,
    hostname: str,
    collectors_file: str | None = None,
    hostname_label: str = "hostname",
    shared_gpu_copies: bool = False,
    devices: str = "auto",
    pod_label_style: str = "current",
) -> list[Profile]:
    """The compatibility profiles among ``names`` (``otel`` is the instruments themselves).

    Raises ``CollectorsError`` for a malformed counters file; fields it names
    that NVML cannot provide (or that otel-gpu does not know) are logged once
    here, with the reason, and skipped.
    """
    # Each profile's module is imported only when it is asked for (start-up time).
    profiles: list[Profile] = []
    if "otel" not in names:  # the collector's own health is on the endpoint whatever the names
        from otel_gpu.export.naming.health import HealthProfile

        profiles.append(HealthProfile())
    if "dcgm" in names:
        from otel_gpu.export.naming.dcgm import DcgmProfile, parse_collectors, select_fields

        entries = parse_collectors(collectors_file) if collectors_file else None
        fields, problems = select_fields(entries)
        for problem in problems:
            log.warning("dcgm profile: not exported: %s", problem)
        profiles.append(DcgmProfile(fields, hostname, hostname_label=hostname_label,
                                    shared_gpu_copies=shared_gpu_copies, devices=devices,
                                    pod_label_style=pod_label_style))
    if "kubelet" in names:
        from otel_gpu.export.naming.kubelet import KubeletProfile

        profiles.append(KubeletProfile())
    return profiles


def render_profiles(profiles: Sequence[Profile], snapshot: Snapshot | None) -> bytes:
    if snapshot is None or not profiles:
        return b""
    families: list[Family] = []
    for profile in profiles:
        families.extend(profile.families(snapshot))
    return render(families).encode()
