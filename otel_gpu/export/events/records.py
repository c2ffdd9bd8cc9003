"""What a GPU event record says: its names, severities, attributes and XID classes.

The detector (:mod:`.detector`) writes records in these words and the OTLP logs
pipeline (:mod:`otel_gpu.export.otlp.logs`) sends them, so both read them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# Severities, as OpenTelemetry's severity text spells them.
FATAL, ERROR, WARN, INFO = "FATAL", "ERROR", "WARN", "INFO"

# XID classes: what the operator has to do.
XID_FATAL = "fatal"
"""The GPU is gone or stopped: drain the node; a reboot or a GPU reset brings it back."""
XID_RESET = "needs_reset"
"""The GPU keeps running but needs a reset (after its work is moved) to be healthy again."""
XID_INFO = "informational"
"""An application fault or a recovered error: the GPU itself is fine."""
XID_UNKNOWN = "unknown"
"""A code not in the catalogue."""

XID_CLASSES: Mapping[int, str] = MappingProxyType({
    **dict.fromkeys((8, 62, 79, 119, 120, 143), XID_FATAL),
    **dict.fromkeys((38, 48, 54, 57, 58, 63, 64, 74, 95, 121, 140, 154), XID_RESET),
    **dict.fromkeys((13, 31, 32, 43, 45, 56, 61, 68, 69, 92, 94, 109), XID_INFO),
})
"""XID code -> class, for every code :data:`otel_gpu.export.naming.xid.MESSAGES` names (but 0)."""
XID_SEVERITY: Mapping[str, str] = MappingProxyType({
    XID_FATAL: FATAL, XID_RESET: ERROR, XID_INFO: WARN, XID_UNKNOWN: WARN,
})

# Attribute names of the records (besides the device's and the pod's).
EVENT_PHASE = "nvidia.gpu.event.phase"
EVENT_DURATION = "nvidia.gpu.event.duration"
XID = "nvidia.gpu.xid"
XID_CLASS = "nvidia.gpu.xid.class"
PREVIOUS_STATE = "nvidia.gpu.previous_state"
HOLDERS = "nvidia.gpu.k8s.holders"
NVLINK_LINK = "nvidia.gpu.nvlink.link"
THROTTLE_KIND = "nvidia.gpu.throttle.kind"
ECC_ERRORS = "nvidia.gpu.ecc.uncorrected.errors"
FABRIC_STATE_ATTR = "nvidia.gpu.fabric.state"
FABRIC_STATUS_ATTR = "nvidia.gpu.fabric.status"
"""The NVML return code a completed fabric registration failed with."""
FABRIC_CONDITION = "nvidia.gpu.fabric.health.condition"
START, END = "start", "end"
MAX_HOLDERS = 32
"""Holders of a shared device named on one record, at most."""

# Names of the records that are no episode (see :mod:`.episodes` for those).
STATE_CHANGE = "nvidia.gpu.state.change"
REMOVED = "nvidia.gpu.removed"
XID_EVENT = "nvidia.gpu.xid"


def xid_class(code: int) -> str:
    """The class of ``code``: :data:`XID_FATAL`, :data:`XID_RESET`, :data:`XID_INFO` or unknown."""
    return XID_CLASSES.get(code, XID_UNKNOWN)


@dataclass(frozen=True)
class Event:
    """One record to send: ``name`` is the OpenTelemetry event name."""

    name: str
    severity: str
    body: str
    time: float
    """Wall-clock time (epoch seconds) of the event."""
    attributes: Mapping[str, object]
    """The device's, the event's, and the holding pod's (``k8s.*``) attributes."""
