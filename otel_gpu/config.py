"""Configuration: defaults <- YAML file <- ``OTEL_GPU_*`` variables <- flags.

:data:`OPTIONS` is the one list of settings, one row each: the CLI flags and
their help, the environment variable names, the config file keys, the fields
of :class:`Config` (and of the OTLP exporter's settings) all come from it, and
``config/otel-gpu.yaml`` is checked against it. Adding a setting is adding a
row. Every bad value becomes one :class:`ConfigError` whose message names the
setting, where it came from, and what is wrong.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, make_dataclass
from pathlib import Path
from typing import Any

import yaml

from otel_gpu._log import FORMATS, LEVELS
from otel_gpu.errors import SetupError

ENV_PREFIX = "OTEL_GPU_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


class ConfigError(SetupError):
    """A bad setting; ``str()`` is one line fit to print before exiting 2."""


# --- value parsers: raise ValueError with what was expected -------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {None: 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """``10``, ``2.5``, ``500ms``, ``10s``, ``1m`` -> seconds (> 0)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 10s, 500ms or 2.5, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"expected a duration like 10s, 500ms or 2.5, got {value!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not seconds > 0:
        raise ValueError(f"must be greater than 0, got {value!r}")
    return seconds


def parse_listen(value: Any) -> tuple[str, int]:
    """``0.0.0.0:9400``, ``:9400``, ``[::]:9400`` -> (host, port)."""
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT such as 0.0.0.0:9400, got {value!r}")
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"port must be 0..65535, got {number}")
    host = host.strip("[]") or "0.0.0.0"
    return host, number


def _choice(allowed: tuple[str, ...], *, exact: bool = False) -> Callable[[Any], str]:
    """One of ``allowed``; case-insensitive unless ``exact`` (label names are not)."""

    def parse(value: Any) -> str:
        text = str(value).strip()
        if not exact:
            text = text.lower()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {value!r}")
        return text

    return parse


def parse_bool(value: Any) -> bool:
    """YAML booleans, and true/false/yes/no/on/off/1/0 from variables and flags."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def parse_list(value: Any) -> tuple[str, ...]:
    """A YAML list, or a comma-separated string."""
    items = value if isinstance(value, (list, tuple)) else str(value or "").split(",")
    return tuple(str(item).strip() for item in items if str(item).strip())


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
            raise ValueError(f"expected prometheus and/or otlp, got {name!r}")
    return tuple(dict.fromkeys(names))


def parse_naming(value: Any) -> tuple[str, ...]:
    names = parse_list(value)
    if not names:
        raise ValueError("expected at least one of otel, dcgm, kubelet")
    for name in names:
        if name not in ("otel", "dcgm", "kubelet"):
            raise ValueError(f"expected otel, dcgm and/or kubelet, got {name!r}")
    return tuple(dict.fromkeys(names))


def _optional_text(value: Any) -> str | None:
    text = "" if value is None else str(value).strip()
    return text or None


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
    def value(self) -> Any:
        """The default, parsed (``None`` stays ``None``: not set)."""
        return self.parse(self.default) if self.default is not None else None


_SECONDS = "SECONDS"
_BOOL = "true|false"

OPTIONS: tuple[Option, ...] = (
    Option("listen", tuple[str, int], "0.0.0.0:9400", parse_listen, "HOST:PORT",
           "address of the Prometheus endpoint (/metrics, /healthz, /readyz)"),
    Option("web_config_file", str | None, None, _optional_text, "FILE",
           "TLS and basic auth for the endpoint: a Prometheus exporter web config file "
           "(tls_server_config, basic_auth_users)"),
    Option("interval", float, "10s", parse_duration, _SECONDS,
           "how often NVML is sampled; scrapes in between are served from the last sample"),
    Option("simulate", str | None, None, _optional_text, "PROFILE|FILE",
           "run against a simulated driver: a built-in profile (h100x8, a100-mig, t4) or a "
           "scenario YAML file"),
    Option("node_name", str | None, None, _optional_text, "NAME",
           "Kubernetes node name for the k8s.node.name resource attribute "
           "(default: the NODE_NAME variable)"),
    Option("pod_attribution", bool, True, parse_bool, _BOOL,
           "attribute GPUs to pods through the kubelet Pod Resources API"),
    Option("kubelet_socket", str, "/var/lib/kubelet/pod-resources/kubelet.sock", str, "PATH",
           "the kubelet Pod Resources socket (mount its directory, not the socket)"),
    Option("kubelet_interval", float, "10s", parse_duration, _SECONDS,
           "how often the kubelet is asked which pod holds which device"),
    Option("kubelet_timeout", float, "5s", parse_duration, _SECONDS,
           "deadline of each kubelet request"),
    Option("kubelet_grace_period", float, "60s", parse_duration, _SECONDS,
           "how long the last pod mapping is kept while the kubelet does not answer"),
    Option("kubelet_resource_names", tuple[str, ...], "", parse_list, "NAMES",
           "extra device plugin resource names to attribute, comma-separated, besides "
           "nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-*"),
    Option("sysfs_root", str, "/", str, "DIR",
           "where the host's /sys is mounted (for NUMA placement), e.g. /host"),
    Option("naming", tuple[str, ...], "otel", parse_naming, "PROFILES",
           "names on the Prometheus endpoint: otel, dcgm (dcgm-exporter's), kubelet (the "
           "kubelet's pre-1.20 accelerator metrics), or several, comma-separated"),
    Option("collectors", str | None, None, _optional_text, "CSV",
           "dcgm profile: a dcgm-exporter counters CSV file choosing the DCGM_FI_* fields",
           short="-f"),
    Option("dcgm_hostname_label", str, "Hostname",
           _choice(("Hostname", "hostname"), exact=True), "Hostname|hostname",
           "dcgm profile: the host label's name (newer dcgm-exporter releases use hostname)"),
    Option("dcgm_shared_gpu_copies", bool, False, parse_bool, _BOOL,
           "dcgm profile: copy a time-sliced GPU's series once per pod, as dcgm-exporter "
           "does (sums over pods then count the GPU several times)"),
    Option("exporters", tuple[str, ...] | None, None, parse_exporters, "LIST",
           "prometheus, otlp, or both (comma-separated); default: prometheus, plus otlp "
           "when an OTLP endpoint is configured"),
    Option("pod_identity", str, "resource", _choice(("resource", "attributes")),
           "resource|attributes",
           "OTLP only: send each pod's series under a Resource naming the pod (resource), "
           "or keep pod identity as data point attributes (attributes)"),
    Option("otlp_endpoint", str | None, None, _optional_text, "URL",
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
    Option("otlp_timeout", float | None, None, _optional(parse_duration), _SECONDS,
           "deadline of one export, retries included (default: the OTEL_* variables, else 10s)"),
    Option("otlp_interval", float | None, None, _optional(parse_duration), _SECONDS,
           "how often metrics are pushed (default: OTEL_METRIC_EXPORT_INTERVAL, else 60s)"),
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
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it ({exc.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"config file {path}: {problem}{where}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: expected a mapping of settings at the top level")
    known = {o.key for o in OPTIONS}
    for key in doc:
        if key not in known:
            raise ConfigError(
                f"config file {path}: unknown key {key!r}; known keys: {', '.join(sorted(known))}"
            )
    return doc


def load(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> Config:
    """Merge every source; later sources override earlier ones.

    ``flags`` holds only the flags the user gave (key -> raw value).
    ``config_file`` defaults to ``$OTEL_GPU_CONFIG``.
    """
    flags = dict(flags or {})
    env = os.environ if environ is None else environ
    path = config_file or env.get(CONFIG_ENV) or None
    from_file = _read_file(path) if path else {}
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw, origin = option.default, "default"
        if option.key in from_file:
            raw, origin = from_file[option.key], f"config file {path}"
        if option.env in env:
            raw, origin = env[option.env], f"environment variable {option.env}"
        if flags.get(option.key) is not None:
            raw, origin = flags[option.key], f"flag {option.flag}"
        try:
            values[option.key] = option.parse(raw) if raw is not None else None
        except ValueError as exc:
            raise ConfigError(f"{option.key} (from {origin}): {exc}") from None
    if values["node_name"] is None:
        values["node_name"] = _optional_text(env.get("NODE_NAME"))
    return Config(**values)
