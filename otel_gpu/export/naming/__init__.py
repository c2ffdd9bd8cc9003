"""Naming profiles: the one catalog shown under other exporters' names.

``otel`` is the OpenTelemetry instruments themselves (written as Prometheus
text by the collector's own writer, ``export.prometheus.text``). ``dcgm`` and
``kubelet`` are profiles that read the same snapshot and write dcgm-exporter's
and the old kubelet's series, for dashboards built on those names. The
profiles shape the Prometheus endpoint only; OTLP always carries the
OpenTelemetry names.

A profile is a module defining ``NAMING`` (a :class:`NamingProfile`) plus one
line in :data:`PROFILES`; the module is imported only when the profile is
asked for (start-up time).
"""

from __future__ import annotations

import importlib
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol, cast

from otel_gpu.config import Config
from otel_gpu.export.naming.exposition import Family
from otel_gpu.snapshot import Snapshot

log = logging.getLogger(__name__)

PROFILES: Mapping[str, str] = MappingProxyType({
    "otel": "otel_gpu.export.naming.otel",
    "dcgm": "otel_gpu.export.naming.dcgm",
    "kubelet": "otel_gpu.export.naming.kubelet",
})
"""Naming profile -> the module whose ``NAMING`` defines it (the ``naming`` setting's choices,
``config.settings.NAMING_PROFILES``, name the same, as a test keeps them)."""


class Profile(Protocol):
    """A set of compatibility series written from one snapshot."""

    def families(self, snapshot: Snapshot) -> list[Family]: ...


@dataclass(frozen=True)
class ProfileOptions:
    """The settings the profiles read (each reads its own); the defaults are the settings'."""

    hostname: str
    collectors_file: str | None = Config.collectors
    hostname_label: str = Config.dcgm_hostname_label
    shared_gpu_copies: bool = Config.dcgm_shared_gpu_copies
    devices: str = Config.dcgm_devices
    pod_label_style: str = Config.dcgm_pod_label_style
    dcgm_names: str = Config.dcgm_names

    @classmethod
    def from_config(cls, config: Config) -> ProfileOptions:
        """The profiles' settings, read from the typed config in this one place."""
        return cls(
            hostname=config.node_name or socket.gethostname(),
            collectors_file=config.collectors,
            hostname_label=config.dcgm_hostname_label,
            shared_gpu_copies=config.dcgm_shared_gpu_copies,
            devices=config.dcgm_devices,
            pod_label_style=config.dcgm_pod_label_style,
            dcgm_names=config.dcgm_names,
        )


class NamingProfile(Protocol):
    """One entry of the registry: a name, a check of its options, and its series."""

    name: str

    def validate(self, options: ProfileOptions) -> list[str]:
        """What the options ask for that cannot be served (logged, not fatal); raises
        ``SetupError`` for options that stop the start (a malformed counters file)."""
        ...

    def build(self, options: ProfileOptions) -> Profile | None:
        """The profile's series writer; ``None`` where the instruments are the series."""
        ...


def profile(name: str) -> NamingProfile:
    """The registered profile ``name``; ``ValueError`` names the known ones."""
    if name not in PROFILES:
        raise ValueError(f"unknown naming profile {name!r}: expected one of {', '.join(PROFILES)}")
    return cast(NamingProfile, importlib.import_module(PROFILES[name]).NAMING)


def build_profiles(names: Sequence[str], options: ProfileOptions) -> list[Profile]:
    """The series writers of the profiles among ``names``.

    Raises ``CollectorsError`` for a malformed counters file; fields it names
    that NVML cannot provide (or that otel-gpu does not know) are logged once
    here, with the reason, and skipped.
    """
    profiles: list[Profile] = []
    if "otel" not in names:  # the collector's own health is on the endpoint whatever the names
        from otel_gpu.export.naming.health import HealthProfile

        profiles.append(HealthProfile())
    for name in names:
        entry = profile(name)
        for problem in entry.validate(options):
            log.warning("%s profile: not exported: %s", name, problem)
        built = entry.build(options)
        if built is not None:
            profiles.append(built)
    return profiles

