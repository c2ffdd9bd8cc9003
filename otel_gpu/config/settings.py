"""The settings: :class:`Config`, one typed field per setting, each carrying its row.

A setting is declared once, as a field of :class:`Config`: its annotation is the
parsed type (what a checker sees at every ``config.x``), and :func:`setting`
gives its parser, raw default, metavar, help and whether only a running
service uses it. :data:`OPTIONS` (the rows the CLI flags, the variables, the
config file keys, the README table and ``config/otel-gpu.yaml`` come from) is
read off the fields. Adding a setting is adding a field, plus its consumer.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from otel_gpu._log import FORMATS, LEVELS
from otel_gpu.config.values import (
    choice,
    duration_in,
    names_in,
    optional,
    optional_text,
    parse_bool,
    parse_endpoint,
    parse_list,
    parse_listen,
    required_text,
    unless_empty,
)

T = TypeVar("T")

ENV_PREFIX = "OTEL_GPU_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
_ROW = "otel_gpu.config.option"


@dataclass(frozen=True)
class Option:
    """One setting's row: its config file key and everything derived from it.

    ``type`` is the annotation of the :class:`Config` field; ``default`` is the
    raw default, parsed like any other value; ``metavar`` names the value in
    ``--help``; ``short`` is an extra short flag, if any; ``serve_only`` marks
    a setting only a running service uses (``check`` samples once and never
    listens, waits, keeps state, renders names or pushes: its help leaves such
    settings out, though it still accepts and checks them).
    """

    key: str
    type: Any  # a type expression (``str | None``, ``tuple[str, int]``): no narrower type
    default: object
    parse: Callable[[object], object]
    metavar: str
    help: str
    short: str | None = None
    serve_only: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.short, self.flag) if self.short else (self.flag,)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def many(self) -> bool:
        """Whether the setting is a list (``tuple[str, ...]``), given as a YAML list or CSV."""
        arms = typing.get_args(self.type) if isinstance(self.type, types.UnionType) else (
            self.type,)
        return any(typing.get_origin(arm) is tuple and typing.get_args(arm)[-1:] == (...,)
                   for arm in arms)

    @property
    def value(self) -> object:
        """The default, parsed (``None`` stays ``None``: not set)."""
        return self.parse(self.default) if self.default is not None else None


def setting(
    parse: Callable[[object], T],
    default: object,
    metavar: str,
    help: str,
    *,
    short: str | None = None,
    serve_only: bool = False,
) -> T:
    """A :class:`Config` field: its default is ``parse(default)``, its row rides in the
    field's metadata (key and type are the field's own name and annotation)."""
    row = Option("", object, default, parse, metavar, help, short, serve_only)
    return field(default=parse(default), metadata={_ROW: row})


def options_of(cls: type) -> tuple[Option, ...]:
    """The rows of a settings dataclass, in field order, each named and typed by its field."""
    hints = typing.get_type_hints(cls)
    return tuple(
        dataclasses.replace(f.metadata[_ROW], key=f.name, type=hints[f.name])
        for f in dataclasses.fields(cls)
        if _ROW in f.metadata
    )


DeviceAttributes = Literal["identity", "all"]
DEVICE_ATTRIBUTES: tuple[DeviceAttributes, ...] = ("identity", "all")

# The choices of the settings whose consumers sit above this layer (the export stage, which
# imports them from here): a test holds each registry (exporters, naming profiles) to its list.
EXPORTERS = ("prometheus", "otlp")
"""The names of ``otel_gpu.export.exporters.REGISTRY``."""
NAMING_PROFILES = ("otel", "dcgm", "kubelet")
"""The names of ``otel_gpu.export.naming.PROFILES``."""
DCGM_HOSTNAME_LABELS = ("Hostname", "hostname")
DCGM_DEVICES = ("auto", "gpus", "instances", "both")
"""dcgm-exporter's ``-d``: ``f`` (instances of a MIG GPU, else the GPU), ``g``, ``i``, ``g+i``."""
DCGM_POD_LABEL_STYLES = ("current", "old")
DCGM_NAMES = ("legacy", "current")
"""dcgm-exporter's names up to 4.8, or those of 4.9 and later."""


def _either(names: tuple[str, ...]) -> str:
    """``a, b, or both`` / ``a, b, c, or several``."""
    return f"{', '.join(names)}, or {'both' if len(names) == 2 else 'several'}"

_SECONDS = "SECONDS"
_BOOL = "true|false"

# The range of each duration: wide enough for any real node, narrow enough that no
# thread sleeps past what a timer can hold, and no loop spins.
INTERVAL = duration_in(0.1, 3600.0)
KUBELET_INTERVAL = duration_in(0.1, 3600.0)
KUBELET_TIMEOUT = duration_in(0.1, 300.0)
KUBELET_GRACE_PERIOD = duration_in(0.1, 86400.0)
OTLP_TIMEOUT = duration_in(0.1, 300.0)
OTLP_INTERVAL = duration_in(1.0, 3600.0)
IDLE_THRESHOLD = duration_in(0.1, 86400.0)


@dataclass(frozen=True)
class Config:
    """The merged settings: one read-only field per setting, holding the parsed value
    (``None``: not set). :func:`otel_gpu.config.load` builds it."""

    listen: tuple[str, int] = setting(
        parse_listen, "0.0.0.0:9400", "HOST:PORT",
        "address of the Prometheus endpoint (/metrics, /healthz, /readyz)", serve_only=True)
    web_config_file: str | None = setting(
        optional_text, None, "FILE",
        "TLS and basic auth for the endpoint: a Prometheus exporter web config file "
        "(tls_server_config, basic_auth_users)")
    prometheus_utf8_names: bool = setting(
        parse_bool, False, _BOOL,
        "serve the OpenTelemetry names untranslated (hw.gpu.utilization) to a scraper that "
        "allows UTF-8 names; off, it gets the underscore names (hw_gpu_utilization) "
        "the dashboards and alert rules use, as every other scraper does", serve_only=True)
    health_listen: tuple[str, int] | None = setting(
        optional(parse_listen), None, "HOST:PORT",
        "a second, plain-HTTP address serving only /healthz and /readyz, for probes that "
        "cannot present the client certificate or password the web config asks for "
        "(default: off)", serve_only=True)
    interval: float = setting(
        INTERVAL, "10s", _SECONDS,
        f"how often NVML is sampled ({INTERVAL.span}); scrapes in between are served "
        "from the last sample", serve_only=True)
    simulate: str | None = setting(
        optional_text, None, "PROFILE|FILE",
        "run against a simulated driver: a built-in profile (demo, h100x8, a100-mig, t4, "
        "h200, gb200) or a scenario YAML file")
    node_name: str | None = setting(
        optional_text, None, "NAME",
        "Kubernetes node name for the k8s.node.name resource attribute "
        "(default: the NODE_NAME variable)", serve_only=True)
    pod_attribution: bool = setting(
        parse_bool, True, _BOOL,
        "attribute GPUs to pods through the kubelet Pod Resources API")
    kubelet_socket: str = setting(
        required_text, "/var/lib/kubelet/pod-resources/kubelet.sock", "PATH",
        "the kubelet Pod Resources socket (mount its directory, not the socket)")
    kubelet_interval: float = setting(
        KUBELET_INTERVAL, "10s", _SECONDS,
        f"how often the kubelet is asked which pod holds which device "
        f"({KUBELET_INTERVAL.span})", serve_only=True)
    kubelet_timeout: float = setting(
        KUBELET_TIMEOUT, "5s", _SECONDS,
        f"deadline of each kubelet request ({KUBELET_TIMEOUT.span})")
    kubelet_grace_period: float = setting(
        KUBELET_GRACE_PERIOD, "60s", _SECONDS,
        f"how long the last pod mapping is kept while the kubelet does not answer "
        f"({KUBELET_GRACE_PERIOD.span})", serve_only=True)
    kubelet_resource_names: tuple[str, ...] = setting(
        parse_list, "", "NAMES",
        "extra device plugin resource names to attribute, comma-separated, besides "
        "nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-*")
    sysfs_root: str = setting(
        required_text, "/", "DIR",
        "where the host's /sys is mounted (for NUMA placement), e.g. /host")
    process_usage: bool = setting(
        parse_bool, False, _BOOL,
        "per-pod usage of each GPU and MIG instance (memory, SM, memory-controller, "
        "encoder and decoder shares) from NVML's per-process readings, each process mapped "
        "to its container through proc_root and pod_log_root; needs hostPID")
    proc_root: str = setting(
        required_text, "/proc", "DIR",
        "process usage: where the host's processes are visible (/proc with hostPID)")
    pod_log_root: str = setting(
        required_text, "/var/log/pods", "DIR",
        "process usage: the kubelet's pod log directory (mounted read-only; only names are "
        "read), whose sibling containers/ names each container id")
    container_socket: str = setting(
        required_text, "/var/run/docker.sock", "PATH",
        "process usage outside Kubernetes: a Docker-compatible API socket (Docker, Podman) "
        "naming the containers GPU processes run in; off while no socket is there")
    hpc_job_mapping_dir: str | None = setting(
        optional_text, None, "DIR",
        "HPC job labels from dcgm-exporter's job mapping directory: one file per GPU "
        "named by its index (<index>.<gpu instance id> for MIG), one job id a line, "
        "written by the scheduler's prolog and epilog (default: off)")
    idle_threshold: float = setting(
        IDLE_THRESHOLD, "30m", _SECONDS,
        "how long a pod, container or job may hold a GPU with no process or no activity "
        f"on it before it is an idle allocation, said in one log record ({IDLE_THRESHOLD.span})",
        serve_only=True)
    device_attributes: DeviceAttributes = setting(
        choice(DEVICE_ATTRIBUTES), "all", "identity|all",
        "device attributes on every series of the OpenTelemetry names (Prometheus and "
        "OTLP): all, or identity (hw.id, hw.type, nvidia.gpu.index, MIG ids, pods and jobs; "
        "model, serial, driver, PCI bus id and NUMA node only on nvidia.gpu.info: about a "
        "third less CPU per collection and half the bytes)", serve_only=True)
    naming: tuple[str, ...] = setting(
        names_in(NAMING_PROFILES), "otel", "PROFILES",
        "names on the Prometheus endpoint: otel, dcgm (dcgm-exporter's), kubelet (the "
        "kubelet's pre-1.20 accelerator metrics), or several, comma-separated")
    collectors: str | None = setting(
        optional_text, None, "CSV",
        "dcgm profile: a dcgm-exporter counters CSV file choosing the DCGM_FI_* fields "
        "(naming must include dcgm)", short="-f")
    dcgm_hostname_label: str = setting(
        choice(DCGM_HOSTNAME_LABELS, exact=True), "hostname", "|".join(DCGM_HOSTNAME_LABELS),
        "dcgm profile: the host label's name (dcgm-exporter's newest releases use hostname, "
        "earlier ones Hostname)", serve_only=True)
    dcgm_shared_gpu_copies: bool = setting(
        parse_bool, False, _BOOL,
        "dcgm profile: copy a time-sliced GPU's series once per pod, as dcgm-exporter "
        "does (sums over pods then count the GPU several times)", serve_only=True)
    dcgm_devices: str = setting(
        choice(DCGM_DEVICES), "auto", "|".join(DCGM_DEVICES),
        "dcgm profile: which devices have series, as dcgm-exporter's -d: auto (f: a MIG "
        "GPU's instances, else the GPU), gpus (g), instances (i) or both (g+i)",
        serve_only=True)
    dcgm_pod_label_style: str = setting(
        choice(DCGM_POD_LABEL_STYLES), "current", "|".join(DCGM_POD_LABEL_STYLES),
        "dcgm profile: pod labels pod, namespace, container (current) or dcgm-exporter's "
        "--use-old-namespace names pod_name, pod_namespace, container_name and uuid (old)",
        serve_only=True)
    dcgm_names: str = setting(
        choice(DCGM_NAMES), "legacy", "|".join(DCGM_NAMES),
        "dcgm profile, built-in field set: dcgm-exporter's names up to 4.8 (legacy) or "
        "those of 4.9 and later (current); a counters file chooses by its own names",
        serve_only=True)
    exporters: tuple[str, ...] | None = setting(
        unless_empty(names_in(EXPORTERS)), None, "LIST",
        f"{_either(EXPORTERS)} (comma-separated); default: prometheus, plus otlp "
        "when an OTLP endpoint is configured")
    pod_identity: str = setting(
        choice(("resource", "attributes")), "resource", "resource|attributes",
        "OTLP only: send each pod's series under a Resource naming the pod (resource), "
        "or keep pod identity as data point attributes (attributes)", serve_only=True)
    otlp_endpoint: str | None = setting(
        optional(parse_endpoint), None, "URL",
        "OTLP endpoint (default: OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT)")
    otlp_protocol: str | None = setting(
        optional(choice(("grpc", "http/protobuf"))), None, "grpc|http/protobuf",
        "grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL, "
        "else http/protobuf)")
    otlp_headers_file: str | None = setting(
        optional_text, None, "FILE",
        "file of key=value headers sent with every export (e.g. a token from a Secret); "
        "added to OTEL_EXPORTER_OTLP_HEADERS")
    otlp_insecure: bool | None = setting(
        optional(parse_bool), None, _BOOL, "gRPC only: plaintext instead of TLS")
    otlp_certificate: str | None = setting(
        optional_text, None, "FILE", "CA bundle to verify the backend (PEM)")
    otlp_client_certificate: str | None = setting(
        optional_text, None, "FILE", "client certificate for mTLS (PEM)")
    otlp_client_key: str | None = setting(
        optional_text, None, "FILE", "client private key for mTLS (PEM)")
    otlp_compression: str | None = setting(
        optional(choice(("gzip", "none"))), None, "gzip|none", "gzip or none",
        serve_only=True)
    otlp_timeout: float | None = setting(
        optional(OTLP_TIMEOUT), None, _SECONDS,
        f"deadline of one export, retries included ({OTLP_TIMEOUT.span}; default: the "
        "OTEL_* variables, else 10s)", serve_only=True)
    otlp_interval: float | None = setting(
        optional(OTLP_INTERVAL), None, _SECONDS,
        f"how often metrics are pushed ({OTLP_INTERVAL.span}; default: "
        "OTEL_METRIC_EXPORT_INTERVAL, else 60s)", serve_only=True)
    otlp_temporality: str | None = setting(
        optional(choice(("cumulative", "delta"))), None, "cumulative|delta",
        "cumulative or delta (default: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, "
        "else cumulative)", serve_only=True)
    log_level: str = setting(
        choice(LEVELS), "info", "LEVEL", "debug, info, warning or error")
    log_format: str = setting(
        choice(FORMATS), "text", "text|json", "text, or json for one JSON object per line")


OPTIONS: tuple[Option, ...] = options_of(Config)
"""Every setting's row, in the order of :class:`Config`'s fields."""
