"""Assembles the pipeline: sample -> (attribute) -> instrument -> export.

:class:`Collector` owns the long-lived pieces and their threads, so the CLI
and the in-process tests start and stop exactly the same thing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from otel_gpu import naming
from otel_gpu._log import LogLimiter
from otel_gpu.config import Config
from otel_gpu.exporters import otlp
from otel_gpu.exporters.prometheus import MetricsServer, RenderCache, new_reader
from otel_gpu.nvml.library import Nvml
from otel_gpu.nvml.sampler import Sampler, SamplerThread, SnapshotStore
from otel_gpu.snapshot import Snapshot
from otel_gpu.telemetry import build_meter_provider, build_resource

log = logging.getLogger(__name__)


def open_nvml(simulate: str | None) -> Nvml:
    """The real driver, or the fake one behind pynvml for ``--simulate``.

    Raises ``ScenarioError`` for a bad scenario; initialisation (and its
    ``NvmlUnavailable``) is left to the caller.
    """
    if simulate:
        from otel_gpu.nvml import fake

        scenario = fake.load_scenario(simulate)
        fake.install(fake.FakeNvml(scenario))
        log.info("simulating NVML with scenario %s", scenario.name)
    return Nvml()


def pod_enricher(config: Config, on_update: Callable[[object], None] | None = None):
    """The Kubernetes attribution stage for ``config`` (imports gRPC only when used)."""
    from otel_gpu.k8s.enrich import PodEnricher
    from otel_gpu.k8s.podresources import PodResourcesWatcher

    watcher = PodResourcesWatcher(
        config.kubelet_socket,
        interval=config.kubelet_interval,
        timeout=config.kubelet_timeout,
        grace_period=config.kubelet_grace_period,
        resource_names=config.kubelet_resource_names,
        on_update=on_update,
    )
    return PodEnricher(watcher, Path(config.sysfs_root))


class Publisher:
    """sample -> attribute -> store, for the sampler and the kubelet thread alike.

    A new sample is published with the current pods; new pods re-publish the
    latest sample. One lock orders the two, so the store always ends with the
    newest sample joined with the newest pods.
    """

    def __init__(self, store: SnapshotStore, enrich: Callable[[Snapshot], Snapshot] | None):
        self.store = store
        self.enrich = enrich
        self._lock = threading.Lock()
        self._limited = LogLimiter(log, 60.0)

    def sample(self, snapshot: Snapshot) -> None:
        with self._lock:
            self.store.publish(self._enriched(snapshot))

    def pods_changed(self, _state: object = None) -> None:
        with self._lock:
            latest = self.store.latest
            if latest is not None:
                self.store.publish(self._enriched(latest))

    def _enriched(self, snapshot: Snapshot) -> Snapshot:
        if self.enrich is None:
            return snapshot
        try:
            return self.enrich(snapshot)
        except Exception:  # noqa: BLE001 - a sample already taken is never thrown away
            self._limited.log("enrich", logging.ERROR,
                              "pod attribution failed; exporting without pod attributes",
                              exc_info=True)
            return snapshot


def otlp_settings(config: Config) -> otlp.OtlpSettings:
    return otlp.OtlpSettings(
        endpoint=config.otlp_endpoint,
        protocol=config.otlp_protocol,
        headers_file=config.otlp_headers_file,
        insecure=config.otlp_insecure,
        certificate=config.otlp_certificate,
        client_certificate=config.otlp_client_certificate,
        client_key=config.otlp_client_key,
        compression=config.otlp_compression,
        timeout=config.otlp_timeout,
        interval=config.otlp_interval,
        temporality=config.otlp_temporality,
        pod_identity=config.pod_identity,
    )


def choose_exporters(config: Config, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The configured exporters; by default Prometheus, plus OTLP once an endpoint is set."""
    if config.exporters:
        return config.exporters
    if otlp.endpoint_configured(otlp_settings(config), environ):
        return ("prometheus", "otlp")
    return ("prometheus",)


class Collector:
    """The running collector: sampler and kubelet threads, MeterProvider, HTTP endpoint."""

    def __init__(
        self,
        config: Config,
        nvml: Nvml,
        *,
        clock: Callable[[], float] = time.monotonic,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        self.config = config
        self.nvml = nvml
        self._clock = clock
        self.store = SnapshotStore()
        self.sampler = Sampler(nvml, clock=clock)
        self.publisher = Publisher(self.store, None)
        self.enricher = None
        if config.pod_attribution:
            self.enricher = pod_enricher(config, on_update=self.publisher.pods_changed)
            self.publisher.enrich = self.enricher
        self.sampler_thread = SamplerThread(self.sampler, self.publisher.sample, config.interval)
        resource = build_resource(config.node_name)
        self.exporters = choose_exporters(config, environ)
        readers: list = []
        self.cache: RenderCache | None = None
        if "prometheus" in self.exporters:
            parts: list[Callable[[], bytes]] = []
            if "otel" in config.naming:
                reader, render_otel = new_reader()
                readers.append(reader)
                parts.append(render_otel)
            views = naming.build_views(
                config.naming,
                hostname=config.node_name or socket.gethostname(),
                collectors_file=config.collectors,
                hostname_label=config.dcgm_hostname_label,
                shared_gpu_copies=config.dcgm_shared_gpu_copies,
            )
            if views:
                parts.append(lambda: naming.render_views(views, self.store.latest))
            self.cache = RenderCache(
                lambda: b"".join(part() for part in parts), lambda: self.store.version,
                max_age=min(config.interval, 60.0), clock=clock,
            )
        if "otlp" in self.exporters:
            readers.append(otlp.build_reader(otlp_settings(config), resource, environ))
        self.provider, self.instruments = build_meter_provider(
            resource, readers, lambda: self.store.latest, clock=clock
        )
        self.server = MetricsServer(config.listen, self.cache, self.readiness)

    @property
    def stale_after(self) -> float:
        """How old the latest sample may be before ``/readyz`` fails."""
        return max(3 * self.config.interval, 30.0)

    def readiness(self) -> tuple[bool, str]:
        snap = self.store.latest
        if snap is None:
            return False, "not ready: no NVML sample has finished yet"
        age = self._clock() - snap.taken_monotonic
        if age > self.stale_after:
            return False, (
                f"not ready: the last NVML sample finished {age:.0f} s ago "
                f"(interval {self.config.interval:g} s); the driver may be hung"
            )
        healthy = snap.healthy_devices()
        if healthy == 0:
            reasons = list(snap.errors) + [d.error for d in snap.devices if d.error]
            return False, "not ready: no readable GPU: " + ("; ".join(reasons) or "none found")
        return True, (
            f"ready: {healthy} of {len(snap.devices)} device(s) readable, "
            f"sample {snap.seq} finished {age:.1f} s ago"
        )

    def start(self) -> None:
        self.server.start()
        if self.enricher is not None:
            self.enricher.watcher.start()
        self.sampler_thread.start()
        host, _ = self.config.listen
        log.info("serving metrics on http://%s:%d/metrics (interval %g s; exporters: %s)",
                 host, self.server.port, self.config.interval, ", ".join(self.exporters))

    def stop(self, final_export_s: float = 2.5) -> None:
        """Stops within a few seconds even if an NVML call or the backend is stuck.

        Shutting the MeterProvider down makes the OTLP reader export once more,
        so the last values are not lost.
        """
        self.server.stop()
        if self.enricher is not None:
            self.enricher.watcher.stop()
        self.sampler_thread.stop(timeout=0.5)
        self.provider.shutdown(timeout_millis=final_export_s * 1000)
        self.nvml.shutdown()
