"""Assembles the pipeline: sample -> (attribute) -> instrument -> export.

:class:`Collector` owns the long-lived pieces and their threads, so the CLI
and the in-process tests start and stop exactly the same thing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from otel_gpu import naming
from otel_gpu._log import LogLimiter
from otel_gpu.config import Config
from otel_gpu.exporters import otlp
from otel_gpu.exporters.prometheus import MetricsServer, RenderCache, new_reader
from otel_gpu.exporters.webconfig import load_web_config
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

    def __init__(
        self,
        store: SnapshotStore,
        enrich: Callable[[Snapshot], Snapshot] | None,
        on_publish: Callable[[Snapshot], None] | None = None,
    ) -> None:
        self.store = store
        self.enrich = enrich
        self.on_publish = on_publish
        self._lock = threading.Lock()
        self._limited = LogLimiter(log, 60.0)

    def sample(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._publish(self._enriched(snapshot))

    def pods_changed(self, _state: object = None) -> None:
        with self._lock:
            latest = self.store.latest
            if latest is not None:
                self._publish(self._enriched(latest))

    def _publish(self, snapshot: Snapshot) -> None:
        self.store.publish(snapshot)
        if self.on_publish is not None:
            self.on_publish(snapshot)

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


class Telemetry:
    """One MeterProvider with the catalog's instruments and its readers."""

    def __init__(
        self,
        resource: Resource,
        latest: Callable[[], Snapshot | None],
        *,
        clock: Callable[[], float],
        prometheus: bool,
        otlp_reader: Callable[[], MetricReader] | None,
    ) -> None:
        readers: list[MetricReader] = []
        self.render: Callable[[], bytes] | None = None
        if prometheus:
            reader, self.render = new_reader()
            readers.append(reader)
        if otlp_reader is not None:
            readers.append(otlp_reader())
        self.provider, self.instruments = build_meter_provider(
            resource, readers, latest, clock=clock
        )

    def shutdown(self, timeout_s: float) -> None:
        """Shutting down makes the OTLP reader export once more: nothing is lost."""
        self.provider.shutdown(timeout_millis=timeout_s * 1000)


class PodChurn:
    """Says when finished pods' series should be released from the SDK.

    The OpenTelemetry SDK keeps every attribute set an instrument ever saw and,
    past 2000 per metric, folds new ones into one overflow series: on a node
    where pods come and go, the live pods' series would vanish within hours.
    Rebuilding the MeterProvider releases them; this counts the (device, pod)
    pairs gone since the last rebuild and asks for one when they pile up.
    """

    def __init__(self, limit: int = 128) -> None:
        self.limit = limit
        self._seen: set[tuple] = set()

    def needs_rebuild(self, snapshot: Snapshot) -> bool:
        if snapshot.pods is None:
            return False
        current = {(r.uuid, r.namespace, r.pod, r.container, r.replica)
                   for r in snapshot.pods.attribution.allocations()}
        self._seen |= current
        if len(self._seen - current) <= max(self.limit, len(current)):
            return False
        self._seen = current
        return True


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
        self.publisher = Publisher(self.store, None, on_publish=self._released_finished_pods)
        self.enricher = None
        if config.pod_attribution:
            self.enricher = pod_enricher(config, on_update=self.publisher.pods_changed)
            self.publisher.enrich = self.enricher
        self.sampler_thread = SamplerThread(self.sampler, self.publisher.sample, config.interval)
        self.exporters = choose_exporters(config, environ)
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            log.warning("OTEL_SDK_DISABLED=true: the OpenTelemetry SDK records nothing, so "
                        "/metrics carries only the dcgm/kubelet profiles and OTLP sends nothing")
        prometheus_otel = "prometheus" in self.exporters and "otel" in config.naming
        resource = build_resource(config.node_name)
        otlp_reader = None
        if "otlp" in self.exporters:
            settings = otlp_settings(config)
            otlp_reader = lambda: otlp.build_reader(settings, resource, environ)  # noqa: E731

        def new_telemetry() -> Telemetry:
            return Telemetry(resource, lambda: self.store.latest, clock=clock,
                             prometheus=prometheus_otel, otlp_reader=otlp_reader)

        self._new_telemetry = new_telemetry
        self.telemetry = new_telemetry()  # a bad OTLP setting fails here, at start-up
        self.churn = PodChurn()
        self.rebuilds = 0
        self.cache: RenderCache | None = None
        if "prometheus" in self.exporters:
            views = naming.build_views(
                config.naming,
                hostname=config.node_name or socket.gethostname(),
                collectors_file=config.collectors,
                hostname_label=config.dcgm_hostname_label,
                shared_gpu_copies=config.dcgm_shared_gpu_copies,
            )
            self.cache = RenderCache(
                lambda: self._render(views), lambda: self.store.version,
                max_age=min(config.interval, 60.0), clock=clock,
            )
        web = load_web_config(config.web_config_file) if config.web_config_file else None
        self.server = MetricsServer(config.listen, self.cache, self.readiness, web)

    def _render(self, views: list) -> bytes:
        otel = self.telemetry.render() if self.telemetry.render is not None else b""
        return otel + naming.render_views(views, self.store.latest)

    def _released_finished_pods(self, snapshot: Snapshot) -> None:
        if not self.churn.needs_rebuild(snapshot):
            return
        new = self._new_telemetry()
        with self.cache.lock if self.cache is not None else contextlib.nullcontext():
            old, self.telemetry = self.telemetry, new  # no render sees the old one retired
        self.rebuilds += 1
        log.info("pods came and went on this node: rebuilt the OpenTelemetry pipeline to "
                 "release finished pods' series (rebuild %d)", self.rebuilds)
        threading.Thread(target=old.shutdown, args=(2.5,), name="otel-gpu-retire",
                         daemon=True).start()

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
        scheme = "https" if self.server.tls is not None else "http"
        log.info("serving metrics on %s://%s:%d/metrics (interval %g s; exporters: %s)",
                 scheme, host, self.server.port, self.config.interval, ", ".join(self.exporters))

    def stop(self, final_export_s: float = 2.5) -> None:
        """Stops within a few seconds even if an NVML call or the backend is stuck.

        Shutting the MeterProvider down makes the OTLP reader export once more,
        so the last values are not lost.
        """
        self.server.stop()
        if self.enricher is not None:
            self.enricher.watcher.stop()
        sampler_stopped = self.sampler_thread.stop(timeout=0.5)
        self.telemetry.shutdown(final_export_s)
        if sampler_stopped:  # never pull the library out from under a call still running
            self.nvml.shutdown()
        else:
            log.warning("an NVML call is still running; exiting without nvmlShutdown")
