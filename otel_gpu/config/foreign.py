"""Other exporters' flags and variables, each answered with what otel-gpu takes instead.

A user moving from dcgm-exporter or node_exporter types the flags they know.
Each gets one line naming otel-gpu's own flag, with the value already written
in its form, rather than being accepted as an alias: one spelling per setting
stays in ``--help``, the README, the config file and the chart, and a value in
another unit (dcgm-exporter's interval is in milliseconds) is never taken
silently. dcgm-exporter's ``-f``/``--collectors``, ``--web-config-file`` and
``--hpc-job-mapping-dir`` are otel-gpu's own flags too, with the same meaning.

dcgm-exporter takes each flag from a ``DCGM_EXPORTER_*`` variable too (its chart
and many clusters configure it so). Those are answered the same way, before the
collector starts (:func:`foreign_variables`), naming otel-gpu's ``OTEL_GPU_*``
variable instead of its flag: none is honoured, so that a value in another unit
is never taken, and a port given there is never silently left for the default.
Only dcgm-exporter's own names are recognised, never its prefix: a Service named
``dcgm-exporter`` gives every pod of its namespace ``DCGM_EXPORTER_SERVICE_HOST``
and kin, which are nobody's setting.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from otel_gpu.config.settings import OPTIONS
from otel_gpu.config.values import format_duration, parse_bool

DCGM = "dcgm-exporter"
NODE = "node_exporter"
_LISTEN = "otel-gpu listens with --listen HOST:PORT"


@dataclass(frozen=True)
class Foreign:
    """Flags of another exporter (``owner``; empty: of many) and otel-gpu's way to say it.

    ``instead`` turns the value given (``None``: none given) into otel-gpu's
    flag and value, or ``None`` where no single one fits.
    """

    flags: tuple[str, ...]
    owner: str
    says: str
    instead: Callable[[str | None], str | None]
    takes_value: bool = True
    variables: tuple[str, ...] = ()
    """The same option's environment variables (dcgm-exporter's ``DCGM_EXPORTER_*``)."""

    def hint(self, written: str, value: str | None) -> str:
        """The one line: whose flag it is, what otel-gpu does, and the flag to type."""
        whose = f" is {self.owner}'s" if self.owner else ""
        suggestion = self.instead(value)
        mean = f" (did you mean {suggestion}?)" if suggestion else ""
        return f"{written}{whose}: {self.says}{mean}"

    def variable_hint(self, name: str, value: str) -> str:
        """The line for the variable ``name`` set to ``value``: the same answer, with
        otel-gpu's variables where the flag's line names its flags."""
        suggestion = self.instead(value)
        mean = f" (did you mean {as_variables(suggestion)}?)" if suggestion else ""
        return (f"environment variable {name} is {self.owner}'s: {as_variables(self.says)}"
                f"{mean}")


def _with(flag: str) -> Callable[[str | None], str | None]:
    """``flag VALUE``; the flag alone where no value was given."""
    return lambda value: f"{flag} {value}" if value else flag


def _port(value: str | None) -> str | None:
    return f"--listen :{value}" if value and value.isdigit() else "--listen"


def _milliseconds(value: str | None) -> str | None:
    if value and value.isdigit() and int(value) > 0:
        return f"--interval {format_duration(int(value) / 1000)}"
    return "--interval"


_DCGM_DEVICES = {"f": "auto", "g": "gpus", "i": "instances", "g+i": "both"}


def _devices(value: str | None) -> str | None:
    chosen = _DCGM_DEVICES.get((value or "").strip().lower())
    return f"--naming dcgm --dcgm-devices {chosen}" if chosen else "--dcgm-devices"


def _log_format(value: str | None) -> str | None:
    return f"--log-format {'text' if value == 'logfmt' else value}" if value else "--log-format"


def _off(value: str | None) -> bool:
    """Whether a boolean variable's value says false (a flag given alone says true)."""
    try:
        return value is not None and not parse_bool(value)
    except ValueError:
        return False


def _kubernetes(value: str | None) -> str | None:
    return "--pod-attribution false" if _off(value) else None


def _collectors(value: str | None) -> str | None:
    return f"--naming dcgm --collectors {value}" if value else "--naming dcgm --collectors"


_ENV_OF = {flag: option.env for option in OPTIONS for flag in option.flags}
_FLAG = re.compile(r"--[a-z][a-z0-9-]*(?: (?!-)[^\s),;]+)?")


def as_variables(text: str) -> str:
    """``text`` with each of otel-gpu's flags (and its value) written as its variable:
    ``--listen :9401`` as ``OTEL_GPU_LISTEN=:9401``; other words as they are."""
    def variable(match: re.Match[str]) -> str:
        flag, _, value = match.group(0).partition(" ")
        env = _ENV_OF.get(flag)
        if env is None:
            return match.group(0)
        return f"{env}={value}" if value else env
    return _FLAG.sub(variable, text)


FOREIGN: tuple[Foreign, ...] = (
    Foreign(("--port",), "", _LISTEN, _port),
    Foreign(("-a", "--address"), DCGM, _LISTEN, _with("--listen"),
            variables=("DCGM_EXPORTER_LISTEN",)),
    Foreign(("--web.listen-address",), NODE, _LISTEN, _with("--listen")),
    Foreign(("--web.config.file",), NODE,
            "otel-gpu reads the same web config file from --web-config-file FILE",
            _with("--web-config-file")),
    Foreign(("--web.telemetry-path",), NODE, "otel-gpu serves its metrics at /metrics only",
            lambda value: None),
    Foreign(("-c", "--collect-interval"), DCGM,
            "otel-gpu samples every --interval DURATION (10s, 500ms), not milliseconds",
            _milliseconds, variables=("DCGM_EXPORTER_INTERVAL",)),
    Foreign(("-d", "--devices"), DCGM,
            "the dcgm naming chooses devices with --dcgm-devices auto|gpus|instances|both",
            _devices, variables=("DCGM_EXPORTER_DEVICES_STR",)),
    Foreign(("-o", "--use-old-namespace"), DCGM,
            "the dcgm naming takes the old pod label names with --dcgm-pod-label-style old",
            lambda value: "--naming dcgm --dcgm-pod-label-style old", takes_value=False,
            variables=("DCGM_EXPORTER_USE_OLD_NAMESPACE",)),
    Foreign(("-k", "--kubernetes"), DCGM,
            "otel-gpu labels pods by default: leave it out (--pod-attribution false turns it "
            "off)", _kubernetes, takes_value=False, variables=("DCGM_EXPORTER_KUBERNETES",)),
    Foreign(("--debug",), DCGM, "otel-gpu logs at --log-level LEVEL",
            lambda value: "--log-level debug", takes_value=False,
            variables=("DCGM_EXPORTER_DEBUG",)),
    Foreign(("--pod-resources-kubelet-socket",), DCGM,
            "otel-gpu asks the kubelet at --kubelet-socket PATH", _with("--kubelet-socket"),
            variables=("DCGM_POD_RESOURCES_KUBELET_SOCKET",)),
    Foreign(("--kubernetes-gpu-id-type",), DCGM,
            "otel-gpu matches the kubelet's GPU UUIDs and device names alike: leave it out",
            lambda value: None, variables=("DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE",)),
    Foreign(("--kubernetes-enable-pod-labels",), DCGM,
            "otel-gpu does not call the API server for pod labels: an OpenTelemetry "
            "Collector's k8sattributes processor adds them over OTLP (docs/migration.md)",
            lambda value: None, takes_value=False,
            variables=("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS",)),
    Foreign(("--kubernetes-enable-pod-uid",), DCGM,
            "otel-gpu writes k8s_pod_uid where the kubelet's pod log directories give it "
            "(--pod-log-root DIR); the dcgm naming writes no uid label",
            lambda value: None, takes_value=False,
            variables=("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID",)),
    Foreign(("-n", "--no-hostname"), DCGM,
            "the dcgm naming always writes the host label, named with "
            "--dcgm-hostname-label hostname|Hostname", lambda value: None, takes_value=False,
            variables=("DCGM_EXPORTER_NO_HOSTNAME",)),
    Foreign(("--replace-blanks-in-model-name",), DCGM,
            "the dcgm naming writes modelName as NVML names the GPU", lambda value: None,
            takes_value=False, variables=("DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",)),
    Foreign(("--xid-count-window-size",), DCGM,
            "otel-gpu counts each XID since start (nvidia_gpu_xid_errors_total): take "
            "increase() over the window you want", lambda value: None,
            variables=("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE",)),
    Foreign(("--clock-events-count-window-size",), DCGM,
            "otel-gpu counts clock throttling time since start "
            "(nvidia_gpu_clock_throttle_time_seconds_total): take increase() over the window "
            "you want", lambda value: None,
            variables=("DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE",)),
    Foreign(("--enable-gpu-bind-unbind-watch",), DCGM,
            "otel-gpu finds GPUs that come and go on its own: leave it out",
            lambda value: None, takes_value=False,
            variables=("DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH",)),
    Foreign((), DCGM, "otel-gpu reads the same counters file from --collectors FILE, with the "
            "dcgm naming", _collectors, variables=("DCGM_EXPORTER_COLLECTORS",)),
    Foreign((), DCGM, "otel-gpu reads the same web config file from --web-config-file FILE",
            _with("--web-config-file"), variables=("DCGM_EXPORTER_WEB_CONFIG_FILE",)),
    Foreign((), DCGM, "otel-gpu reads the same directory from --hpc-job-mapping-dir DIR",
            _with("--hpc-job-mapping-dir"), variables=("DCGM_HPC_JOB_MAPPING_DIR",)),
    Foreign((), DCGM, "otel-gpu logs --log-format text|json", _log_format,
            variables=("DCGM_EXPORTER_LOG_FORMAT",)),
    Foreign(("--log.level",), NODE, "otel-gpu logs at --log-level LEVEL", _with("--log-level")),
    Foreign(("--log.format",), NODE, "otel-gpu logs --log-format text|json", _log_format),
)
"""The conventional flags and variables of the exporters otel-gpu replaces (docs/migration.md
lists them)."""

BY_FLAG: dict[str, Foreign] = {flag: row for row in FOREIGN for flag in row.flags}
BY_VARIABLE: dict[str, Foreign] = {name: row for row in FOREIGN for name in row.variables}


def foreign_variables(environ: Mapping[str, str]) -> list[str]:
    """One line per dcgm-exporter variable set (to anything but blanks), in the table's
    order (the listening port and the interval first)."""
    return [row.variable_hint(name, environ[name].strip()[:200])
            for row in FOREIGN for name in row.variables if environ.get(name, "").strip()]
