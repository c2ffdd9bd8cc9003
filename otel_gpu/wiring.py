"""Wiring: builds the pipeline's stages from the configuration and starts them.

sample (:mod:`otel_gpu.sample.sampler`) -> attribute (:mod:`otel_gpu.attribute.k8s.enrich`)
-> publish (:mod:`otel_gpu.publish.pipeline`) -> instrument (:mod:`otel_gpu.instrument.telemetry`)
-> export (:mod:`otel_gpu.export`). :class:`Service` owns the long-lived
pieces, so the CLI and the in-process tests start and stop exactly the same
thing; :func:`sample_once` is the same pipeline run once, for ``check``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from otel_gpu.attribute.enrich import Bounded, Enricher, Watched
from otel_gpu.attribute.gputime import GpuTimeLedger, GpuTimeStage
from otel_gpu.config import Config
from otel_gpu.errors import SetupError
from otel_gpu.export import exporters
from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.http import endpoint
from otel_gpu.export.http.endpoint import MetricsServer
from otel_gpu.export.seam import Published, Served
from otel_gpu.instrument.cardinality import CardinalityGuard
from otel_gpu.instrument.catalog import CATALOG, all_sources
from otel_gpu.instrument.telemetry import Collect, Telemetry, build_resource
from otel_gpu.publish.pipeline import Pipeline, Subscriber
from otel_gpu.publish.readiness import Readiness
from otel_gpu.publish.store import SnapshotStore
from otel_gpu.publish.timings import Timings
from otel_gpu.sample.gpm import WINDOW as GPM_WINDOW
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.snapshot import Snapshot

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricReader

if TYPE_CHECKING:
    from otel_gpu.sim.node import RunningNode

if TYPE_CHECKING:  # gRPC is imported only once a kubelet socket exists
    from otel_gpu.attribute.container.enrich import ContainerEnricher
    from otel_gpu.attribute.hpc.enrich import JobEnricher
    from otel_gpu.attribute.k8s.enrich import PodEnricher

log = logging.getLogger(__name__)

CHECK_READ_TIMEOUT_S = 5.0


def open_nvml(simulate: str | None) -> Nvml:
    """The real driver, or the fake one behind pynvml for ``--simulate``.

    Raises ``ScenarioError`` for a bad scenario; initialisation (and its
    ``NvmlUnavailable``) is left to the caller.
    """
    if simulate:
        from otel_gpu import sim

        scenario = sim.load_scenario(simulate)
        sim.install(sim.FakeNvml(scenario))
        log.info("simulating NVML with scenario %s", scenario.name)
    return Nvml()


def simulated_node(config: Config) -> tuple[Config, RunningNode | None]:
    """Under ``--simulate``, a scenario with pods runs its node: the ``/proc`` and kubelet
    log trees in a temporary directory and a fake kubelet serving its pods there. The
    collector is pointed at them (each path setting left at its default; ``idle_threshold``
    too where the node names one, so an idle pod's record comes soon) with process usage on,
    so the simulation shows pods, per-pod usage and energy per pod at once."""
    if not config.simulate or not config.pod_attribution:
        return config, None
    from otel_gpu import sim

    scenario = sim.load_scenario(config.simulate)
    if scenario.node is None or not scenario.node.pods:
        return config, None
    from otel_gpu.sim.node import run_node

    node = run_node(scenario)
    default = Config()
    settings: dict[str, object] = {"kubelet_socket": node.kubelet.socket_path,
                                   "proc_root": str(node.paths.proc_root),
                                   "pod_log_root": str(node.paths.pod_log_root),
                                   "container_socket": node.runtime_socket}
    if scenario.node.idle_threshold is not None:
        settings["idle_threshold"] = scenario.node.idle_threshold
    changes = {key: value for key, value in settings.items()
               if getattr(config, key) == getattr(default, key)}
    config = dataclasses.replace(config, process_usage=True)
    config = dataclasses.replace(config, **changes)  # type: ignore[arg-type]  # str, float
    log.info("simulating a node with %d pod(s): a kubelet on %s, processes under %s",
             len(scenario.node.pods), config.kubelet_socket, config.proc_root)
    return config, node


def process_usage(config: Config) -> bool:
    """Whether NVML's per-process lists are read: asked for. They are joined to pods with
    pod attribution on, to containers outside Kubernetes, and name each process's Slurm job
    with or without either."""
    if config.process_usage and not config.pod_attribution:
        log.info("process_usage with pod_attribution off: GPU processes are read for their "
                 "Slurm jobs, and for usage per container outside Kubernetes "
                 "(nvidia.gpu.container.*) where a container runtime answers; no usage per "
                 "pod (nvidia.gpu.k8s.*)")
    return config.process_usage


def job_enricher(config: Config) -> JobEnricher | None:
    """The HPC job stage (mapping directory, Slurm cgroups); None when neither is on."""
    from otel_gpu.attribute.hpc.enrich import job_enricher as build

    return build(config.hpc_job_mapping_dir, config.proc_root, processes=config.process_usage)


def container_enricher(config: Config) -> ContainerEnricher | None:
    """The stage naming containers outside Kubernetes; None without process usage."""
    from otel_gpu.attribute.container.enrich import container_enricher as build

    return build(config.container_socket, config.proc_root, interval=config.kubelet_interval,
                 processes=config.process_usage)


def pod_enricher(
    config: Config, on_update: Callable[[object], None] | None = None
) -> PodEnricher:
    """The Kubernetes attribution stage for ``config`` (gRPC is imported once a socket exists)."""
    from otel_gpu.attribute.k8s.enrich import PodEnricher
    from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher
    from otel_gpu.attribute.k8s.processes import PodLogIndex, ProcessMapper

    watcher = PodResourcesWatcher(
        config.kubelet_socket,
        interval=config.kubelet_interval,
        timeout=config.kubelet_timeout,
        grace_period=config.kubelet_grace_period,
        resource_names=config.kubelet_resource_names,
        initial=None,
        on_update=on_update,
    )
    pod_dirs = PodLogIndex(Path(config.pod_log_root))
    processes = (ProcessMapper(Path(config.proc_root), index=pod_dirs)
                 if config.process_usage else None)
    return PodEnricher(watcher, Path(config.sysfs_root), processes=processes, pod_dirs=pod_dirs)


def gpu_time(config: Config) -> GpuTimeStage:
    """The GPU time stage, last: it counts time by the workloads the others named."""
    return GpuTimeStage(GpuTimeLedger(idle_threshold=config.idle_threshold,
                                      pods=config.pod_attribution))


def gpm_window(config: Config) -> float:
    """A new GPU's GPM measurement window; none under ``--simulate``, whose profiling
    counters are the scenario's values whatever time passes between two samples."""
    return 0.0 if config.simulate else GPM_WINDOW


def sample_once(config: Config, nvml: Nvml) -> Snapshot:
    """One sample, joined with one kubelet answer when attribution is on (what ``check`` shows).

    NVML is shut down before the kubelet is asked, so a slow kubelet never
    holds the driver open. A GPU whose call hangs is given up on after
    :data:`CHECK_READ_TIMEOUT_S` and shown as hung.
    """
    config, node = simulated_node(config)
    try:
        return _sample_once(config, nvml)
    finally:
        if node is not None:
            node.close()


def _sample_once(config: Config, nvml: Nvml) -> Snapshot:
    sampler = Sampler(nvml, all_sources(CATALOG), read_timeout=CHECK_READ_TIMEOUT_S,
                      sysfs_root=Path(config.sysfs_root), process_usage=process_usage(config),
                      gpm_window=gpm_window(config))
    try:
        snapshot = sampler.sample()
    finally:
        busy = sampler.busy()
        sampler.close()
        if busy:  # never pull the library out from under a call still running
            log.warning("an NVML call is still running; exiting without nvmlShutdown")
        else:
            nvml.shutdown()
    if config.pod_attribution:
        enrich = pod_enricher(config)
        try:
            if enrich.refresh():
                snapshot = _once(enrich, "pod", snapshot)
        finally:
            enrich.stop()
    jobs = job_enricher(config)
    if jobs is not None:
        snapshot = _once(jobs, "HPC job", snapshot)
    containers = container_enricher(config)
    if containers is not None:
        containers.refresh()
        snapshot = _once(containers, "container", snapshot)
    return gpu_time(config).process(snapshot)


def _once(stage: Enricher, name: str, snapshot: Snapshot) -> Snapshot:
    """``stage`` applied to ``snapshot``, given up on after :data:`CHECK_READ_TIMEOUT_S`."""
    bounded = Bounded(stage, name, CHECK_READ_TIMEOUT_S)
    try:
        return bounded.process(snapshot)
    finally:
        bounded.close()


def validate(config: Config, environ: Mapping[str, str]) -> None:
    """Every check ``serve`` makes before it starts, each by the piece it concerns: the
    endpoint's web config, then the SDK's variables and each chosen exporter's own. ``check``
    makes them too, so that it refuses what ``serve`` would; a ``SetupError`` names the
    first that fails."""
    endpoint.validate(config)
    exporters.validate(config, environ)


def _address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets as in a URL: ``[::1]:9400``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Service:
    """The running collector: pipeline thread, kubelet thread, MeterProvider, HTTP endpoint.

    Built in the order the data flows back from the readers: the snapshot store
    first (every reader takes the latest snapshot from it), then the sampler,
    the MeterProvider, the subscribers of the publish loop (cardinality guard,
    render cache, event detector), the loop, the attribute stages (the
    kubelet's tells the loop of new pods), and the HTTP endpoints.
    """

    def __init__(
        self,
        config: Config,
        nvml: Nvml,
        *,
        clock: Callable[[], float] = time.monotonic,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        config, self.node = simulated_node(config)
        try:
            self._build(config, nvml, clock, environ)
        except BaseException:
            if self.node is not None:
                self.node.close()
            raise

    def _build(self, config: Config, nvml: Nvml, clock: Callable[[], float],
               environ: Mapping[str, str]) -> None:
        self.config = config
        self.nvml = nvml
        self.timings = timings = Timings.from_interval(config.interval)
        self.outputs = exporters.select(config, environ)
        self.exporters = tuple(dict.fromkeys(e.name for e in self.outputs))
        exporters.settle(self.outputs, environ)
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            log.warning("OTEL_SDK_DISABLED=true: the OpenTelemetry SDK records nothing, so "
                        "/metrics carries only the dcgm/kubelet profiles and OTLP sends nothing")
        self.store = store = SnapshotStore()
        self.sampler = Sampler(nvml, all_sources(CATALOG), clock=clock,
                               read_timeout=timings.read_timeout,
                               sysfs_root=Path(config.sysfs_root),
                               process_usage=process_usage(config),
                               gpm_window=gpm_window(config))
        resource = build_resource(config.node_name)
        # What needs the Resource (the events' logs pipeline) is built here: a bad setting
        # fails at start-up. Each exporter may add metrics to the catalog.
        added = [m for e in self.outputs for m in e.prepare(resource)]

        def readers() -> tuple[list[MetricReader], Collect]:
            source = CollectingReader()  # the one collection per cycle, for every exporter
            pushed = [r for e in self.outputs for r in e.readers(resource, source)]
            return [source, *pushed], source.collect_now

        # A bad OTLP setting fails here, at start-up.
        self.telemetry = telemetry = Telemetry(
            resource, lambda: store.latest, readers, clock=clock,
            catalog=(*CATALOG, *added), device_attributes=config.device_attributes)
        published = Published(store, telemetry, timings, clock)
        subscribers: list[Subscriber] = [CardinalityGuard(telemetry)]
        subscribers += [s for e in self.outputs for s in e.attach(published)]
        self.pipeline = Pipeline(store, self.sampler.sample, timings=timings,
                                 subscribers=subscribers)
        self.enricher = None
        if config.pod_attribution:  # the kubelet thread re-publishes through the pipeline
            self.enricher = pod_enricher(config, on_update=self.pipeline.pods_changed)
        self.jobs = job_enricher(config)
        self.containers = container_enricher(config)
        # Those whose source is asked on a thread of its own: started and stopped alike.
        self.watched: tuple[Watched, ...] = tuple(
            stage for stage in (self.enricher, self.containers) if stage is not None)
        # Each on a thread of its own, waited for as long as a GPU's reads: a file read
        # that never returns costs the attributes, never the sampling.
        named = (("pod", self.enricher), ("HPC job", self.jobs), ("container", self.containers))
        self.stages = tuple(Bounded(stage, name, timings.read_timeout)
                            for name, stage in named if stage is not None)
        for stage in self.stages:  # in this order: pods, then jobs, then containers
            self.pipeline.add_stage(stage.process)
        self.pipeline.add_stage(gpu_time(config).process)  # arithmetic only: no thread
        self.readiness = Readiness(store, timings, clock, notes=self._notes)
        web = endpoint.web_config(config)
        # The endpoint answers health probes whatever the exporters; /metrics is the body of
        # the exporter that has one (404 without).
        scrape = next((e.scrape for e in self.outputs if e.scrape is not None), None)
        self.server = MetricsServer(config.listen, scrape, self.readiness, web)
        # Probes that cannot pass the web config's TLS or auth ask here: health only, plain.
        self.health_server: MetricsServer | None = None
        if config.health_listen is not None:
            try:
                self.health_server = MetricsServer(config.health_listen, None, self.readiness)
            except OSError as exc:
                self.server.server_close()
                raise SetupError(f"health_listen {_address(*config.health_listen)}: "
                                 f"{exc.strerror or exc}") from None

    def _notes(self) -> tuple[str, ...]:
        """What ``/readyz`` adds to its reason: why pods are not attributed, once that is
        more than a kubelet starting (still ready: the device metrics are right)."""
        problem = self.enricher.problem() if self.enricher is not None else None
        return () if problem is None else (f"pods not attributed: {problem}",)

    def start(self) -> None:
        self.server.start()
        if self.health_server is not None:
            self.health_server.start()
        for watched in self.watched:
            watched.start()
        self.pipeline.start()
        host, _ = self.config.listen
        scheme = "https" if self.server.tls is not None else "http"
        served = Served(f"{scheme}://{_address(host, self.server.port)}", self.config.interval)
        if not any(e.scrape is not None for e in self.outputs):
            log.info("serving probes on %s/healthz and /readyz; /metrics answers 404 (no "
                     "exporter serves it: exporters %s)", served.url, ", ".join(self.exporters))
        for exporter in self.outputs:  # one line each: where the telemetry goes
            log.info("%s", exporter.describe(served))
        if self.health_server is not None and self.config.health_listen is not None:
            host, _ = self.config.health_listen
            log.info("serving health checks on http://%s/healthz and /readyz",
                     _address(host, self.health_server.port))

    def stop(self, final_export_s: float = 2.5) -> None:
        """Stops within a few seconds even if an NVML call or the backend is stuck.

        Shutting the MeterProvider down makes the OTLP reader export once more,
        so the last values are not lost.
        """
        self.server.stop()
        if self.health_server is not None:
            self.health_server.stop()
        for watched in self.watched:
            watched.stop()
        idle = self.pipeline.stop(timeout=0.5) and not self.sampler.busy()
        for stage in self.stages:
            stage.close()
        # The queued events go out beside the final metrics export, within the same time.
        started = time.monotonic()
        stopping = [threading.Thread(target=e.stop, args=(final_export_s,), daemon=True,
                                     name=f"otel-gpu-stop-{e.name}") for e in self.outputs]
        for thread in stopping:
            thread.start()
        self.telemetry.shutdown(final_export_s)
        for thread in stopping:
            thread.join(max(0.0, final_export_s - (time.monotonic() - started)))
        self.sampler.close()  # frees what it holds in NVML (GPM buffers) while NVML is up
        if self.node is not None:  # the simulated node's kubelet and files
            self.node.close()
        if idle:  # never pull the library out from under a call still running
            self.nvml.shutdown()
        else:
            log.warning("an NVML call is still running; exiting without nvmlShutdown")
