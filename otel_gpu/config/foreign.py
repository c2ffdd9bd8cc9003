"""Other exporters' flags, each answered with what otel-gpu takes instead.

A user moving from dcgm-exporter or node_exporter types the flags they know.
Each gets one line naming otel-gpu's own flag, with the value already written
in its form, rather than being accepted as an alias: one spelling per setting
stays in ``--help``, the README, the config file and the chart, and a value in
another unit (dcgm-exporter's interval is in milliseconds) is never taken
silently. dcgm-exporter's ``-f``/``--collectors``, ``--web-config-file`` and
``--hpc-job-mapping-dir`` are otel-gpu's own flags too, with the same meaning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from otel_gpu.config.values import format_duration

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

    def hint(self, written: str, value: str | None) -> str:
        """The one line: whose flag it is, what otel-gpu does, and the flag to type."""
        whose = f" is {self.owner}'s" if self.owner else ""
        suggestion = self.instead(value)
        mean = f" (did you mean {suggestion}?)" if suggestion else ""
        return f"{written}{whose}: {self.says}{mean}"


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


FOREIGN: tuple[Foreign, ...] = (
    Foreign(("--port",), "", _LISTEN, _port),
    Foreign(("-a", "--address"), DCGM, _LISTEN, _with("--listen")),
    Foreign(("--web.listen-address",), NODE, _LISTEN, _with("--listen")),
    Foreign(("--web.config.file",), NODE,
            "otel-gpu reads the same web config file from --web-config-file FILE",
            _with("--web-config-file")),
    Foreign(("--web.telemetry-path",), NODE, "otel-gpu serves its metrics at /metrics only",
            lambda value: None),
    Foreign(("-c", "--collect-interval"), DCGM,
            "otel-gpu samples every --interval DURATION (10s, 500ms), not milliseconds",
            _milliseconds),
    Foreign(("-d", "--devices"), DCGM,
            "the dcgm naming chooses devices with --dcgm-devices auto|gpus|instances|both",
            _devices),
    Foreign(("-o", "--use-old-namespace"), DCGM,
            "the dcgm naming takes the old pod label names with --dcgm-pod-label-style old",
            lambda value: "--naming dcgm --dcgm-pod-label-style old", takes_value=False),
    Foreign(("-k", "--kubernetes"), DCGM,
            "otel-gpu labels pods by default: leave it out (--pod-attribution false turns it "
            "off)", lambda value: None, takes_value=False),
    Foreign(("--debug",), DCGM, "otel-gpu logs at --log-level LEVEL",
            lambda value: "--log-level debug", takes_value=False),
    Foreign(("--log.level",), NODE, "otel-gpu logs at --log-level LEVEL", _with("--log-level")),
    Foreign(("--log.format",), NODE, "otel-gpu logs --log-format text|json", _log_format),
)
"""The conventional flags of the exporters otel-gpu replaces (docs/migration.md lists them)."""

BY_FLAG: dict[str, Foreign] = {flag: row for row in FOREIGN for flag in row.flags}
