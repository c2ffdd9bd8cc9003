"""Configuration: defaults <- YAML file <- ``OTEL_GPU_*`` variables <- flags.

:data:`OPTIONS` is the one list of settings, one row each: the CLI flags and
their help, the environment variable names, the config file keys, the fields
of :class:`Config` (and of the OTLP exporter's settings) all come from it, and
``config/otel-gpu.yaml`` is checked against it. Adding a setting is adding a
row. Every bad value becomes one :class:`ConfigError` whose message names the
setting, where it came from, and what is wrong.
"""

from __future__ import annotations

import datetime
import ipaddress
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, make_dataclass
from typing import Any
from urllib.parse import urlsplit

from otel_gpu._files import FileError, load_yaml
from otel_gpu._log import FORMATS, LEVELS
from otel_gpu.errors import SetupError

ENV_PREFIX = "OTEL_GPU_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


class ConfigError(SetupError):
    """A bad setting; ``str()`` is one line fit to print before exiting 2."""


# --- value parsers: raise ValueError with what was expected -------------------

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {None: 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0}
_SCALARS = (str, int, float, bool)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _show(value: Any) -> str:
    """``repr(value)``, cut short: a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any) -> str:
    """What a YAML value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (set, frozenset)):
        return "a set"
    if isinstance(value, (bytes, bytearray)):
        return "binary data"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"a date ({value})"
    return _show(value)


def parse_duration(value: Any) -> float:
    """``10``, ``2.5``, ``500ms``, ``10s``, ``1m`` -> seconds (finite, > 0)."""
    expected = f"expected a duration like 10s, 500ms or 2.5, got {_kind(value)}"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(expected)
    try:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            match = _DURATION.match(value)
            if not match:
                raise ValueError(expected)
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError(f"must be a finite duration, got {_show(value)}")
    if not seconds > 0:
        raise ValueError(f"must be greater than 0, got {_show(value)}")
    return seconds


def format_duration(seconds: float) -> str:
    """``0.1`` -> ``100ms``, ``300`` -> ``5m``, ``86400`` -> ``24h``."""
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def duration_in(minimum: float, maximum: float) -> Callable[[Any], float]:
    """:func:`parse_duration`, limited to ``minimum``..``maximum`` seconds (both included)."""
    span = f"{format_duration(minimum)} to {format_duration(maximum)}"

    def parse(value: Any) -> float:
        seconds = parse_duration(value)
        if not minimum <= seconds <= maximum:
            raise ValueError(f"must be from {span}, got {_show(value)}")
        return seconds

    parse.span = span  # type: ignore[attr-defined]
    return parse


def _host(text: str) -> bool:
    """An IP address (IPv6 with or without brackets) or a host name."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(text)) and len(text) <= 253


_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


def parse_listen(value: Any) -> tuple[str, int]:
    """``0.0.0.0:9400``, ``:9400``, ``[::]:9400`` -> (host, port)."""
    expected = f"expected HOST:PORT such as 0.0.0.0:9400, got {_kind(value)}"
    if not isinstance(value, str):
        raise ValueError(expected)
    host, sep, port = value.strip().rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port):
        raise ValueError(expected)
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"port must be 0..65535, got {number}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host or ":" not in host:
            raise ValueError(f"expected an IPv6 address between [ and ], got {_show(value)}")
    host = host or "0.0.0.0"
    if not _host(host):
        raise ValueError(f"{_show(host)} is not an IP address or host name")
    return host, number


def _choice(allowed: tuple[str, ...], *, exact: bool = False) -> Callable[[Any], str]:
    """One of ``allowed``; case-insensitive unless ``exact`` (label names are not)."""

    def parse(value: Any) -> str:
        text = str(value).strip() if isinstance(value, str) else ""
        if not exact:
            text = text.lower()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {_kind(value)}")
        return text

    return parse


def parse_bool(value: Any) -> bool:
    """YAML booleans, and true/false/yes/no/on/off/1/0 from variables and flags."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else ""
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"expected true or false, got {_kind(value)}")


def _item(value: Any, position: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a list of names, but item {position} is {_kind(value)}")
    text = str(value).strip()
    if _CONTROL.search(text):
        raise ValueError(f"item {position} contains a control character")
    return text


def parse_list(value: Any) -> tuple[str, ...]:
    """A YAML list, or a comma-separated string."""
    if isinstance(value, (list, tuple)):
        items = [_item(item, i) for i, item in enumerate(value, 1)]
    elif value is None or isinstance(value, str):
        items = [_item(item, i) for i, item in enumerate((value or "").split(","), 1)]
    else:
        raise ValueError(f"expected a list or a comma-separated string, got {_kind(value)}")
    return tuple(item for item in items if item)


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``parse``, except that empty means "not set" (left to the OTEL_* variables)."""

    def parse_optional(value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return parse(value)

    return parse_optional


def parse_exporters(value: Any) -> tuple[str, ...] | None:
    names = parse_list(value)
    if not names:
        return None
    for name in names:
        if name not in ("prometheus", "otlp"):
            raise ValueError(f"expected prometheus and/or otlp, got {_show(name)}")
    return tuple(dict.fromkeys(names))


def parse_naming(value: Any) -> tuple[str, ...]:
    names = parse_list(value)
    if not names:
        raise ValueError("expected at least one of otel, dcgm, kubelet")
    for name in names:
        if name not in ("otel", "dcgm", "kubelet"):
            raise ValueError(f"expected otel, dcgm and/or kubelet, got {_show(name)}")
    return tuple(dict.fromkeys(names))


def _text(value: Any) -> str:
    """A string (a number is taken as written); no control characters; may be empty."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a string, got {_kind(value)}")
    text = str(value).strip()
    if _CONTROL.search(text):
        raise ValueError(f"contains a control character: {_show(text)}")
    return text


def _required_text(value: Any) -> str:
    text = _text(value)
    if not text:
        raise ValueError("must not be empty")
    return text


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value) or None


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def parse_endpoint(value: Any) -> str:
    """``http[s]://host[:port][/path]``, or ``host:port`` (gRPC)."""
    text = _required_text(value)
    if any(ch.isspace() for ch in text):
        raise ValueError(f"must not contain spaces: {_show(text)}")
    if not _URL.match(text):
        host, sep, port = text.rpartition(":")
        if not sep or not host or not _host(host.strip("[]")) or not port.isdigit():
            raise ValueError(f"expected a URL such as http://collector:4318, got {_show(text)}")
        return text
    try:
        url = urlsplit(text)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc}): {_show(text)}") from None
    if url.scheme.lower() not in ("http", "https"):
        raise ValueError(f"expected an http:// or https:// URL, got {_show(text)}")
    if not url.hostname:
        raise ValueError(f"expected a URL with a host, such as http://collector:4318, "
                         f"got {_show(text)}")
    if port == 0:
        raise ValueError(f"port must be 1..65535, got {_show(text)}")
    return text


@dataclass(frozen=True)
class Option:
    """One setting: its config file key, and everything derived from it.

    ``type`` is the type of the parsed value (the annotation of the
    :class:`Config` field); ``default`` is the raw default, parsed like any
    other value; ``metavar`` names the value in ``--help``; ``short`` is an
    extra short flag, if any.
    """

    key: str
    type: Any
    default: Any
    parse: Callable[[Any], Any]
    metavar: str
    help: str
    short: str | None = None

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
    def value(self) -> Any:
        """The default, parsed (``None`` stays ``None``: not set)."""
        return self.parse(self.default) if self.default is not None else None


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

OPTIONS: tuple[Option, ...] = (
    Option("listen", tuple[str, int], "0.0.0.0:9400", parse_listen, "HOST:PORT",
           "address of the Prometheus endpoint (/metrics, /healthz, /readyz)"),
    Option("web_config_file", str | None, None, _optional_text, "FILE",
           "TLS and basic auth for the endpoint: a Prometheus exporter web config file "
           "(tls_server_config, basic_auth_users)"),
    Option("health_listen", tuple[str, int] | None, None, _optional(parse_listen), "HOST:PORT",
           "a second, plain-HTTP address serving only /healthz and /readyz, for probes that "
           "cannot present the client certificate or password the web config asks for "
           "(default: off)"),
    Option("interval", float, "10s", INTERVAL, _SECONDS,
           f"how often NVML is sampled ({INTERVAL.span}); scrapes in between are served "
           "from the last sample"),
    Option("simulate", str | None, None, _optional_text, "PROFILE|FILE",
           "run against a simulated driver: a built-in profile (h100x8, a100-mig, t4) or a "
           "scenario YAML file"),
    Option("node_name", str | None, None, _optional_text, "NAME",
           "Kubernetes node name for the k8s.node.name resource attribute "
           "(default: the NODE_NAME variable)"),
    Option("pod_attribution", bool, True, parse_bool, _BOOL,
           "attribute GPUs to pods through the kubelet Pod Resources API"),
    Option("kubelet_socket", str, "/var/lib/kubelet/pod-resources/kubelet.sock", _required_text,
           "PATH",
           "the kubelet Pod Resources socket (mount its directory, not the socket)"),
    Option("kubelet_interval", float, "10s", KUBELET_INTERVAL, _SECONDS,
           f"how often the kubelet is asked which pod holds which device "
           f"({KUBELET_INTERVAL.span})"),
    Option("kubelet_timeout", float, "5s", KUBELET_TIMEOUT, _SECONDS,
           f"deadline of each kubelet request ({KUBELET_TIMEOUT.span})"),
    Option("kubelet_grace_period", float, "60s", KUBELET_GRACE_PERIOD, _SECONDS,
           f"how long the last pod mapping is kept while the kubelet does not answer "
           f"({KUBELET_GRACE_PERIOD.span})"),
    Option("kubelet_resource_names", tuple[str, ...], "", parse_list, "NAMES",
           "extra device plugin resource names to attribute, comma-separated, besides "
           "nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-*"),
    Option("sysfs_root", str, "/", _required_text, "DIR",
           "where the host's /sys is mounted (for NUMA placement), e.g. /host"),
    Option("process_usage", bool, False, parse_bool, _BOOL,
           "per-pod usage of each GPU and MIG instance (memory, SM, memory-controller, "
           "encoder and decoder shares) from NVML's per-process readings, each process mapped "
           "to its container through proc_root and pod_log_root; needs hostPID"),
    Option("proc_root", str, "/proc", _required_text, "DIR",
           "process usage: where the host's processes are visible (/proc with hostPID)"),
    Option("pod_log_root", str, "/var/log/pods", _required_text, "DIR",
           "process usage: the kubelet's pod log directory (mounted read-only; only names are "
           "read), whose sibling containers/ names each container id"),
    Option("container_socket", str, "/var/run/docker.sock", _required_text, "PATH",
           "process usage outside Kubernetes: a Docker-compatible API socket (Docker, Podman) "
           "naming the containers GPU processes run in; off while no socket is there"),
    Option("hpc_job_mapping_dir", str | None, None, _optional_text, "DIR",
           "HPC job labels from dcgm-exporter's job mapping directory: one file per GPU "
           "named by its index (<index>.<gpu instance id> for MIG), one job id a line, "
           "written by the scheduler's prolog and epilog (default: off)"),
    Option("device_attributes", str, "all", _choice(("identity", "all")), "identity|all",
           "device attributes on every series of the OpenTelemetry names (Prometheus and "
           "OTLP): all, or identity (hw.id, hw.type, nvidia.gpu.index, MIG ids, pods and jobs; "
           "model, serial, driver, PCI bus id and NUMA node only on nvidia.gpu.info: about a "
           "third less CPU per collection and half the bytes)"),
    Option("naming", tuple[str, ...], "otel", parse_naming, "PROFILES",
           "names on the Prometheus endpoint: otel, dcgm (dcgm-exporter's), kubelet (the "
           "kubelet's pre-1.20 accelerator metrics), or several, comma-separated"),
    Option("collectors", str | None, None, _optional_text, "CSV",
           "dcgm profile: a dcgm-exporter counters CSV file choosing the DCGM_FI_* fields "
           "(naming must include dcgm)",
           short="-f"),
    Option("dcgm_hostname_label", str, "hostname",
           _choice(("Hostname", "hostname"), exact=True), "Hostname|hostname",
           "dcgm profile: the host label's name (dcgm-exporter's newest releases use hostname, "
           "earlier ones Hostname)"),
    Option("dcgm_shared_gpu_copies", bool, False, parse_bool, _BOOL,
           "dcgm profile: copy a time-sliced GPU's series once per pod, as dcgm-exporter "
           "does (sums over pods then count the GPU several times)"),
    Option("dcgm_devices", str, "auto", _choice(("auto", "gpus", "instances", "both")),
           "auto|gpus|instances|both",
           "dcgm profile: which devices have series, as dcgm-exporter's -d: auto (f: a MIG "
           "GPU's instances, else the GPU), gpus (g), instances (i) or both (g+i)"),
    Option("dcgm_pod_label_style", str, "current", _choice(("current", "old")), "current|old",
           "dcgm profile: pod labels pod, namespace, container (current) or dcgm-exporter's "
           "--use-old-namespace names pod_name, pod_namespace, container_name and uuid (old)"),
    Option("exporters", tuple[str, ...] | None, None, parse_exporters, "LIST",
           "prometheus, otlp, or both (comma-separated); default: prometheus, plus otlp "
           "when an OTLP endpoint is configured"),
    Option("pod_identity", str, "resource", _choice(("resource", "attributes")),
           "resource|attributes",
           "OTLP only: send each pod's series under a Resource naming the pod (resource), "
           "or keep pod identity as data point attributes (attributes)"),
    Option("otlp_endpoint", str | None, None, _optional(parse_endpoint), "URL",
           "OTLP endpoint (default: OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT)"),
    Option("otlp_protocol", str | None, None, _optional(_choice(("grpc", "http/protobuf"))),
           "grpc|http/protobuf",
           "grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL, "
           "else http/protobuf)"),
    Option("otlp_headers_file", str | None, None, _optional_text, "FILE",
           "file of key=value headers sent with every export (e.g. a token from a Secret); "
           "added to OTEL_EXPORTER_OTLP_HEADERS"),
    Option("otlp_insecure", bool | None, None, _optional(parse_bool), _BOOL,
           "gRPC only: plaintext instead of TLS"),
    Option("otlp_certificate", str | None, None, _optional_text, "FILE",
           "CA bundle to verify the backend (PEM)"),
    Option("otlp_client_certificate", str | None, None, _optional_text, "FILE",
           "client certificate for mTLS (PEM)"),
    Option("otlp_client_key", str | None, None, _optional_text, "FILE",
           "client private key for mTLS (PEM)"),
    Option("otlp_compression", str | None, None, _optional(_choice(("gzip", "none"))),
           "gzip|none", "gzip or none"),
    Option("otlp_timeout", float | None, None, _optional(OTLP_TIMEOUT), _SECONDS,
           f"deadline of one export, retries included ({OTLP_TIMEOUT.span}; default: the "
           "OTEL_* variables, else 10s)"),
    Option("otlp_interval", float | None, None, _optional(OTLP_INTERVAL), _SECONDS,
           f"how often metrics are pushed ({OTLP_INTERVAL.span}; default: "
           "OTEL_METRIC_EXPORT_INTERVAL, else 60s)"),
    Option("otlp_temporality", str | None, None, _optional(_choice(("cumulative", "delta"))),
           "cumulative|delta",
           "cumulative or delta (default: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, "
           "else cumulative)"),
    Option("log_level", str, "info", _choice(LEVELS), "LEVEL", "debug, info, warning or error"),
    Option("log_format", str, "text", _choice(FORMATS), "text|json",
           "text, or json for one JSON object per line"),
)


def config_class(options: Sequence[Option]) -> type:
    """A frozen dataclass with one field per row of ``options``, typed by the row."""
    cls = make_dataclass("Config", [(o.key, o.type) for o in options], frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = (
        "The merged settings: one read-only field per row of :data:`OPTIONS`, "
        "holding the parsed value (``None``: not set)."
    )
    return cls


Config = config_class(OPTIONS)


def _read_file(path: str) -> dict[str, Any]:
    try:
        doc = load_yaml(path, "config file")
    except FileError as exc:
        raise ConfigError(str(exc)) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: expected a mapping of settings at the top level")
    known = {o.key for o in OPTIONS}
    for key in doc:
        if key not in known:
            raise ConfigError(
                f"config file {path}: unknown key {_show(key)}; "
                f"known keys: {', '.join(sorted(known))}"
            )
    return doc


def _check_shape(option: Option, raw: Any) -> None:
    """A single value for a plain setting; a list of values (or one) for a list setting."""
    if isinstance(raw, _SCALARS) or (option.many and isinstance(raw, list)):
        return
    wanted = "a list or a single value" if option.many else "a single value"
    raise ValueError(f"expected {wanted}, got {_kind(raw)}")


def load(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> Config:
    """Merge every source; later sources override earlier ones.

    ``flags`` holds only the flags the user gave (key -> raw value).
    ``config_file`` defaults to ``$OTEL_GPU_CONFIG``. A key set to null in the
    file counts as absent: the setting keeps its default (or the variable's or
    flag's value).
    """
    flags = dict(flags or {})
    env = os.environ if environ is None else environ
    path = config_file or env.get(CONFIG_ENV) or None
    from_file = _read_file(path) if path else {}
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for option in OPTIONS:
        raw, origin = option.default, "default"
        if from_file.get(option.key) is not None:
            raw, origin = from_file[option.key], f"config file {path}"
        if option.env in env:
            raw, origin = env[option.env], f"environment variable {option.env}"
        if flags.get(option.key) is not None:
            raw, origin = flags[option.key], f"flag {'/'.join(option.flags)}"
        origins[option.key] = origin
        try:
            if raw is not None:
                _check_shape(option, raw)
            values[option.key] = option.parse(raw) if raw is not None else None
        except (ValueError, TypeError, OverflowError) as exc:
            raise ConfigError(f"{option.key} (from {origin}): {_one_line(exc)}") from None
    if values["node_name"] is None:
        try:
            values["node_name"] = _optional_text(env.get("NODE_NAME"))
        except ValueError as exc:
            raise ConfigError(f"node_name (from environment variable NODE_NAME): {exc}") from None
    if values["collectors"] is not None and "dcgm" not in values["naming"]:
        raise ConfigError(
            f"collectors (from {origins['collectors']}): a counters file is only used by the "
            f"dcgm naming profile, and naming is {','.join(values['naming'])}; add dcgm to "
            "naming (e.g. --naming otel,dcgm) or leave collectors unset"
        )
    return Config(**values)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or exc.__class__.__name__
