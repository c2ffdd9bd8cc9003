"""The counters-file rows that are not plain DCGM fields: labels and dcgm-exporter's own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from otel_gpu.export.naming.dcgm.counters import DEFAULT_COUNTERS, DEFAULT_COUNTERS_CURRENT
from otel_gpu.export.naming.dcgm.current import CURRENT_LABELS
from otel_gpu.export.naming.dcgm.fields import DcgmField
from otel_gpu.snapshot import DEGRADED, FAILED, OK, PREDICTED_FAILURE, Device, Snapshot

# --- label fields: attached to every series of the device, not series themselves ----


@dataclass(frozen=True)
class LabelField:
    """A ``label``-type counters-file row: a label named after the field on every series.

    ``get`` reads it from the whole GPU (for a MIG instance: its parent) and the
    snapshot; ``None`` leaves the label out for that device.
    """

    name: str
    get: Callable[[Device, Snapshot], str | None]
    type: str = "label"


def _minor(device: Device, _: Snapshot) -> str | None:
    return str(device.minor_number) if device.minor_number is not None else None


_LABELS: Mapping[str, LabelField] = {f.name: f for f in (
    LabelField("DCGM_FI_DRIVER_VERSION", lambda d, s: s.driver_version),
    LabelField("DCGM_FI_DEV_SERIAL", lambda d, s: d.serial),
    LabelField("DCGM_FI_DEV_VBIOS_VERSION", lambda d, s: d.vbios_version),
    LabelField("DCGM_FI_DEV_UUID", lambda d, s: d.uuid),
    LabelField("DCGM_FI_DEV_NAME", lambda d, s: d.model),
    LabelField("DCGM_FI_DEV_PCI_BUSID", lambda d, s: d.pci_bus_id or None),
    LabelField("DCGM_FI_DEV_MINOR_NUMBER", _minor),
)}
LABEL_FIELDS: Mapping[str, LabelField] = {
    **_LABELS, **{new: replace(_LABELS[old], name=new) for new, old in CURRENT_LABELS.items()},
}
"""The label rows otel-gpu knows, under DCGM's older and newer names."""
DEFAULT_LABELS: tuple[str, ...] = tuple(
    name for name, type_, _ in (*DEFAULT_COUNTERS, *DEFAULT_COUNTERS_CURRENT) if type_ == "label"
)
"""The label rows of NVIDIA's default counters file."""


# --- exporter fields: DCGM_EXP_*, computed from several samples -----------------------

CLOCK_EVENTS: Mapping[int, str] = {
    0x1: "gpu_idle",
    0x2: "clocks_setting",
    0x4: "power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
"""Clock event (throttle) reason bits, NVML's and DCGM's alike, by dcgm-exporter's names."""

WINDOW_SECONDS = 300.0
"""dcgm-exporter's default window for the ``*_COUNT`` fields (5 minutes)."""

# DCGM health results (DCGM_HEALTH_RESULT_PASS, _WARN, _FAIL) by hw.state.
_HEALTH = {OK: 0.0, DEGRADED: 10.0, PREDICTED_FAILURE: 20.0, FAILED: 20.0}


@dataclass(frozen=True)
class ExporterField:
    """A ``DCGM_EXP_*`` row: a value dcgm-exporter computes rather than reads from DCGM."""

    name: str
    type: str
    help: str
    kind: str
    """``xid_count``, ``xid_total``, ``clock_count``, ``clock_total`` or ``health``."""
    note: str = ""
    """How otel-gpu computes it, for the migration guide."""


EXPORTER_FIELDS: Mapping[str, ExporterField] = {f.name: f for f in (
    ExporterField("DCGM_EXP_XID_ERRORS_COUNT", "gauge",
                  "XID errors seen in the last window, by XID code.", "xid_count",
                  "XID events of each code in the last 5 minutes (`xid`, `window_size_in_ms`)"),
    ExporterField("DCGM_EXP_XID_ERRORS_TOTAL", "counter",
                  "XID errors seen since otel-gpu started, by XID code.", "xid_total",
                  "`nvidia.gpu.xid.errors` by code (`xid`)"),
    ExporterField("DCGM_EXP_CLOCK_EVENTS_COUNT", "gauge",
                  "Samples in the last window with each clock event reason active.",
                  "clock_count",
                  "samples of the last 5 minutes with each throttle reason bit set "
                  "(`clock_event`, `window_size_in_ms`)"),
    ExporterField("DCGM_EXP_CLOCK_EVENTS_TOTAL", "counter",
                  "Clock event reasons that became active since otel-gpu started.",
                  "clock_total", "times each throttle reason bit turned on (`clock_event`)"),
    ExporterField("DCGM_EXP_GPU_HEALTH_STATUS", "gauge",
                  "GPU health: 0 pass, 10 warning, 20 failure.", "health",
                  "`hw.status` as DCGM's health result: ok 0, degraded 10, "
                  "predicted_failure and failed 20; one series per GPU, no `health_watch`"),
)}

Column = DcgmField | LabelField | ExporterField
