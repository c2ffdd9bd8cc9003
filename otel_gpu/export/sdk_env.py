"""The OTEL_* variables the OpenTelemetry SDK reads by itself, checked by us first.

The SDK parses them deep inside its constructors and export loops, so a bad
value reaches the user as its traceback (a negative interval), or as
silence (an interval of ``nan`` starts "fine" and never pushes). Each one
that changes what otel-gpu does is checked here at start-up:

- a variable that stands for one of our settings (the export interval and
  timeouts, compression, insecure, temporality) is held to that setting's
  rules: a bad value is a :class:`~otel_gpu.errors.SetupError` naming the
  variable (exit 2), as the setting's would be;
- the others follow the specification (an invalid value is ignored with a
  warning): one warning line naming the variable and the default used, and
  the variable is taken out of the process's environment, so that the SDK
  sees it unset and uses that default.

``OTEL_EXPORTER_OTLP_*`` endpoints, headers and TLS files are checked by
:mod:`otel_gpu.export.otlp.transport`; ``OTEL_LOGS_EXPORTER`` by
:mod:`otel_gpu.export.otlp.logs`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

from otel_gpu.config import format_duration
from otel_gpu.errors import SetupError

log = logging.getLogger(__name__)

INTERVAL_S = (0.01, 3600.0)
"""``otlp_interval``'s upper bound (seconds); the variable may go lower than the setting's
1 s, down to 10 ms, as tests and demos push that fast."""
TIMEOUT_S = (0.1, 300.0)
"""The bounds of ``otlp_timeout`` (seconds)."""
MAX_LIMIT = 1 << 20
"""The largest attribute count or length limit taken (anything above is no limit in practice)."""


class SdkEnvError(SetupError):
    """A bad OTEL_* variable that stands for one of our settings; one line."""


def _number(raw: str) -> float | None:
    try:
        value = float(raw.strip())
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _duration(unit_s: float, bounds: tuple[float, float], unit: str) -> Callable[[str], str | None]:
    """A number of ``unit`` (seconds or milliseconds) within ``bounds`` seconds."""
    low, high = bounds
    span = f"{format_duration(low)} to {format_duration(high)}"

    def problem(raw: str) -> str | None:
        value = _number(raw)
        if value is None:
            return f"expected a finite number of {unit}, got {raw.strip()[:40]!r}"
        if not low <= value * unit_s <= high:
            return f"must be from {span} (in {unit}), got {raw.strip()[:40]}"
        return None

    return problem


def _choice(*allowed: str) -> Callable[[str], str | None]:
    def problem(raw: str) -> str | None:
        if raw.strip().lower() in allowed:
            return None
        return f"expected one of {', '.join(allowed)}, got {raw.strip()[:40]!r}"

    return problem


def _count(raw: str) -> str | None:
    text = raw.strip()
    if not text.isdigit() or int(text) > MAX_LIMIT:
        return f"expected a whole number from 0 to {MAX_LIMIT}, got {text[:40]!r}"
    return None


def _detectors(raw: str) -> str | None:
    from importlib.metadata import entry_points

    known = {"*", *entry_points(group="opentelemetry_resource_detector").names}
    unknown = [n.strip() for n in raw.split(",") if n.strip() and n.strip() not in known]
    if unknown:
        return (f"unknown resource detector {unknown[0][:40]!r} (installed: "
                f"{', '.join(sorted(known - {'*'}))})")
    return None


@dataclass(frozen=True)
class Variable:
    """One variable: what a good value is, and what the SDK does without it."""

    name: str
    problem: Callable[[str], str | None]
    """What is wrong with a value, or None."""
    default: str | None = None
    """Set: the specification's "ignore it" applies, with this default (shown in the
    warning); None: a bad value stops the start (it stands for one of our settings)."""


_MS = _duration(0.001, INTERVAL_S, "milliseconds")
_TIMEOUT_MS = _duration(0.001, TIMEOUT_S, "milliseconds")
_TIMEOUT = _duration(1.0, TIMEOUT_S, "seconds")  # the Python SDK's OTLP timeouts are seconds
_BOOL = _choice("true", "false")

SDK: tuple[Variable, ...] = (
    Variable("OTEL_SDK_DISABLED", _BOOL, "false"),
    Variable("OTEL_METRICS_EXEMPLAR_FILTER", _choice("always_on", "always_off", "trace_based"),
             "trace_based"),
    Variable("OTEL_ATTRIBUTE_COUNT_LIMIT", _count, "128"),
    Variable("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", _count, "no limit"),
    Variable("OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT", _count, "OTEL_ATTRIBUTE_COUNT_LIMIT"),
    Variable("OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT", _count,
             "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"),
    Variable("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", _detectors, "none"),
    Variable("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", _BOOL, "false"),
)
"""Read by the MeterProvider, the LoggerProvider and the Resource, whatever the exporters."""

OTLP: tuple[Variable, ...] = (
    Variable("OTEL_METRIC_EXPORT_INTERVAL", _MS),
    Variable("OTEL_METRIC_EXPORT_TIMEOUT", _TIMEOUT_MS),
    *(Variable(f"OTEL_EXPORTER_OTLP_{s}TIMEOUT", _TIMEOUT) for s in ("", "METRICS_", "LOGS_")),
    *(Variable(f"OTEL_EXPORTER_OTLP_{s}INSECURE", _BOOL) for s in ("", "METRICS_", "LOGS_")),
    *(Variable(f"OTEL_EXPORTER_OTLP_{s}COMPRESSION", _choice("gzip", "deflate", "none"))
      for s in ("", "METRICS_", "LOGS_")),
    Variable("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
             _choice("cumulative", "delta", "lowmemory")),
    Variable("OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES",
             lambda raw: _codes(raw)),
    Variable("OTEL_BLRP_EXPORT_TIMEOUT", _count, "30000"),
)
"""Read by the OTLP exporters, readers and the logs' batch processor."""


def _codes(raw: str) -> str | None:
    import grpc

    names = {code.name for code in grpc.StatusCode}
    bad = [c.strip() for c in raw.split(",") if c.strip() and c.strip().upper() not in names]
    if bad:
        return f"unknown gRPC status code {bad[0][:40]!r} (for example UNAVAILABLE)"
    return None


_ignored: dict[str, str] = {}
"""The ignored variables of this process and their warnings, until the service says them."""


def _check(variables: tuple[Variable, ...], environ: Mapping[str, str], *,
           warn: bool) -> list[str]:
    """Raise for the first bad variable that stands for a setting; the ignorable bad ones,
    taken out of the process's environment when ``environ`` is it (the SDK reads some at
    import time, so this runs before the SDK's logs module is imported)."""
    ignored: list[str] = []
    for variable in variables:
        raw = environ.get(variable.name)
        if raw is None or not raw.strip():
            continue
        problem = variable.problem(raw)
        if problem is None:
            continue
        if variable.default is None:
            raise SdkEnvError(f"{variable.name}: {problem}")
        ignored.append(variable.name)
        message = f"{variable.name}: {problem}; ignored, using the default ({variable.default})"
        if warn:
            log.warning("%s", message)
        if environ is os.environ:
            _ignored[variable.name] = message
            target: MutableMapping[str, str] = os.environ
            target.pop(variable.name, None)
    return ignored


def check(environ: Mapping[str, str]) -> list[str]:
    """Check the SDK-wide variables (warning about the ignorable ones); their names."""
    return _check(SDK, environ, warn=True)


def check_otlp(environ: Mapping[str, str]) -> list[str]:
    """Check the variables of the OTLP pipeline (warning about the ignorable ones)."""
    return _check(OTLP, environ, warn=True)


def settle(environ: Mapping[str, str], variables: tuple[Variable, ...] = ()) -> None:
    """What the service runs first: check the SDK's variables and the exporters' own
    ``variables``, and warn once about each ignored one, also those a check before it took
    out of the environment (the CLI's, whose warnings ``serve`` silences)."""
    _check(SDK, environ, warn=environ is not os.environ)
    if variables:
        _check(variables, environ, warn=environ is not os.environ)
    if environ is os.environ:
        for name in list(_ignored):
            log.warning("%s", _ignored.pop(name))
