"""Renders a snapshot under dcgm-exporter's names and labels.

As dcgm-exporter's default does, a GPU in MIG mode is reported through its GPU
instances, not as a whole (``devices``); the ``DCGM_EXP_*`` fields are computed
from the snapshots the endpoint renders.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from otel_gpu.config.settings import DCGM_DEVICES, DCGM_POD_LABEL_STYLES
from otel_gpu.export.naming import ProfileOptions
from otel_gpu.export.naming.dcgm.columns import (
    _HEALTH,
    CLOCK_EVENTS,
    WINDOW_SECONDS,
    Column,
    ExporterField,
    LabelField,
)
from otel_gpu.export.naming.dcgm.fields import DcgmField
from otel_gpu.export.naming.exposition import Family
from otel_gpu.sample import sources as c
from otel_gpu.snapshot import FAILED, DeviceSample, Snapshot

# --- rendering -------------------------------------------------------------------------

_POD_LABELS = {
    "current": ("pod", "namespace", "container"),
    "old": ("pod_name", "pod_namespace", "container_name"),  # --use-old-namespace
}
HPC_JOB_LABEL = "hpc_job"
"""dcgm-exporter's job label (--hpc-job-mapping-dir): one copy of a series per job."""
# DCGM reports these per GPU only; on a GPU instance they have no value.
_NOT_ON_INSTANCES = frozenset({
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
})


def _instance_scoped(name: str) -> bool:
    """Fields a GPU instance has its own value of (memory, profiling); for the rest, a
    GPU instance carries its GPU's value, as DCGM reports them."""
    return name.startswith(("DCGM_FI_DEV_FB_", "DCGM_FI_PROF_"))


@dataclass
class _Seen:
    """What the profile remembers of one GPU across snapshots, for the DCGM_EXP fields."""

    history: deque = field(default_factory=deque)
    """(monotonic time, XID counts, clock reason bits or None), oldest first."""
    last_seq: int = -1
    reasons: int = 0
    clock_totals: dict[int, int] = field(default_factory=lambda: dict.fromkeys(CLOCK_EVENTS, 0))


@dataclass
class _Counter:
    """A rate field's last reading of one device: the counter total and the rate it gave."""

    seq: int
    taken: float
    total: float
    rate: float | None


class _Row(NamedTuple):
    sample: DeviceSample
    gpu: DeviceSample | None
    """The whole GPU's sample: the parent's for a MIG instance (``None`` if unknown)."""


class DcgmProfile:
    """Renders a snapshot under dcgm-exporter's names and labels."""

    def __init__(
        self, fields: Sequence[Column], options: ProfileOptions, *, window: float = WINDOW_SECONDS,
    ) -> None:
        devices, pod_label_style = options.devices, options.pod_label_style
        if devices not in DCGM_DEVICES:
            raise ValueError(f"devices: expected one of {', '.join(DCGM_DEVICES)}")
        if pod_label_style not in DCGM_POD_LABEL_STYLES:
            raise ValueError(
                f"pod_label_style: expected one of {', '.join(DCGM_POD_LABEL_STYLES)}")
        self.fields = tuple(fields)
        self.values = tuple(c for c in self.fields if not isinstance(c, LabelField))
        self.labels = tuple(c for c in self.fields if isinstance(c, LabelField))
        self.hostname = options.hostname
        self.hostname_label = options.hostname_label
        self.shared_gpu_copies = options.shared_gpu_copies
        self.devices = devices
        self.pod_labels = _POD_LABELS[pod_label_style]
        self.uuid_label = "uuid" if pod_label_style == "old" else "UUID"
        self.window = window
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}
        self._counters: dict[tuple[str, str], _Counter] = {}

    # which devices, with which labels

    def _rows(self, snapshot: Snapshot) -> list[_Row]:
        gpus = {s.device.uuid: s for s in snapshot.devices if not s.device.is_mig}
        with_instances = {s.device.parent_uuid for s in snapshot.devices if s.device.is_mig}
        rows = []
        for s in snapshot.devices:
            if s.device.is_mig:
                if self.devices != "gpus":
                    rows.append(_Row(s, gpus.get(s.device.parent_uuid or "")))
            elif self.devices in ("gpus", "both") or (
                    self.devices == "auto" and s.device.uuid not in with_instances):
                rows.append(_Row(s, s))
        return rows

    def _labels(self, row: _Row, snapshot: Snapshot) -> dict[str, str]:
        dev = row.sample.device
        labels = {
            "gpu": str(dev.index),
            # a MIG instance is named by its parent GPU's UUID plus the instance labels
            self.uuid_label: dev.parent_uuid or dev.uuid,
            "pci_bus_id": dev.pci_bus_id,
            "device": f"nvidia{dev.minor_number if dev.minor_number is not None else dev.index}",
            "modelName": dev.model,
        }
        if dev.is_mig:
            labels["GPU_I_PROFILE"] = dev.mig_profile or ""
            labels["GPU_I_ID"] = str(dev.gpu_instance_id if dev.gpu_instance_id is not None
                                     else "")
        labels[self.hostname_label] = self.hostname
        whole = row.gpu.device if row.gpu is not None else dev
        for label in self.labels:
            value = label.get(whole, snapshot)
            if value is not None:
                labels[label.name] = value
        return labels

    def _copies(self, sample: DeviceSample, snapshot: Snapshot) -> list[dict[str, str]]:
        """Pod and job labels per copy of the device's series: one copy, or one per sharer;
        and, as dcgm-exporter does, each of those once per HPC job using the device."""
        refs = snapshot.series_pods(sample.device.uuid, per_sharer=self.shared_gpu_copies)
        pod, namespace, container = self.pod_labels
        copies = [{pod: r.pod, namespace: r.namespace, container: r.container}
                  for r in refs] or [{}]
        jobs = snapshot.series_jobs(sample.device.uuid)
        if not jobs:
            return copies
        return [{**labels, HPC_JOB_LABEL: job.job_id} for labels in copies for job in jobs]

    # values

    def _value(self, field: DcgmField, row: _Row, snapshot: Snapshot) -> float | None:
        sample = row.sample
        if not sample.device.is_mig:
            return self._read(field, sample, snapshot)
        name = field.replaces or field.dcgm_name or field.name  # the rules name the old field
        if name in _NOT_ON_INSTANCES:
            return None
        own = self._read(field, sample, snapshot)
        if own is not None or _instance_scoped(name) or row.gpu is None or not row.gpu.readable:
            return own
        return self._read(field, row.gpu, snapshot)

    def _read(self, field: DcgmField, sample: DeviceSample, snapshot: Snapshot) -> float | None:
        """The field's value; for a rate, from this snapshot's total and the last one's."""
        if not field.rate:
            return field.value(sample)
        key = (sample.device.uuid, field.name)
        last = self._counters.get(key)
        if last is not None and last.seq == snapshot.seq:
            return last.rate  # the same snapshot rendered again
        total = field.total(sample)
        if total is None:
            self._counters.pop(key, None)
            return None
        taken = snapshot.taken_monotonic
        rate = None
        if last is not None and taken > last.taken and total >= last.total:  # not reset
            rate = (total - last.total) / (taken - last.taken) * field.factor
        self._counters[key] = _Counter(snapshot.seq, taken, total, rate)
        return rate

    def _exporter(self, field: ExporterField, row: _Row,
                  now: float) -> list[tuple[dict[str, str], float]]:
        gpu = row.gpu
        if gpu is None:
            return []
        window = {"window_size_in_ms": str(int(self.window * 1000))}
        seen = self._seen.get(gpu.device.uuid)
        if field.kind == "health":
            return [({}, _HEALTH.get(gpu.state, 0.0))]
        if field.kind == "xid_total":
            counts = gpu.xid_counts
            return [({"xid": str(code)}, float(n)) for code, n in sorted(counts.items())] or [
                ({}, 0.0)]
        if field.kind == "clock_total":
            totals = seen.clock_totals if seen else dict.fromkeys(CLOCK_EVENTS, 0)
            return [({"clock_event": CLOCK_EVENTS[bit]}, float(n)) for bit, n in totals.items()]
        if field.kind == "xid_count":
            counts = self._xid_in_window(seen, gpu, now)
            return [({"xid": str(code), **window}, float(n))
                    for code, n in sorted(counts.items()) if n > 0] or [(window, 0.0)]
        counts = self._clock_in_window(seen, now)
        return [({"clock_event": CLOCK_EVENTS[bit], **window}, float(n))
                for bit, n in counts.items() if n > 0] or [(window, 0.0)]

    def _observe(self, snapshot: Snapshot) -> None:
        """Remember this snapshot's XID counts and clock reasons, once per snapshot."""
        horizon = snapshot.taken_monotonic - self.window
        for sample in snapshot.devices:
            if sample.device.is_mig:
                continue
            seen = self._seen.setdefault(sample.device.uuid, _Seen())
            if snapshot.seq <= seen.last_seq:
                continue
            seen.last_seq = snapshot.seq
            raw = sample.values.get(c.CLOCK_REASONS.key) if sample.readable else None
            reasons = int(raw) if raw is not None else None
            if reasons is not None:
                for bit in CLOCK_EVENTS:
                    if reasons & bit and not seen.reasons & bit:
                        seen.clock_totals[bit] += 1
                seen.reasons = reasons
            seen.history.append((snapshot.taken_monotonic, dict(sample.xid_counts), reasons))
            # keep one entry at or before the window's start: the baseline of the XID counts
            while len(seen.history) > 1 and seen.history[1][0] <= horizon:
                seen.history.popleft()

    def _xid_in_window(self, seen: _Seen | None, gpu: DeviceSample,
                       now: float) -> dict[int, int]:
        base: Mapping[int, int] = {}
        if seen and seen.history and seen.history[0][0] <= now - self.window:
            base = seen.history[0][1]
        return {code: n - base.get(code, 0) for code, n in gpu.xid_counts.items()}

    def _clock_in_window(self, seen: _Seen | None, now: float) -> dict[int, int]:
        counts = dict.fromkeys(CLOCK_EVENTS, 0)
        for taken, _, reasons in seen.history if seen else ():
            if reasons is None or taken <= now - self.window:
                continue
            for bit in CLOCK_EVENTS:
                if reasons & bit:
                    counts[bit] += 1
        return counts

    def families(self, snapshot: Snapshot) -> list[Family]:
        with self._lock:
            if any(isinstance(col, ExporterField) for col in self.values):
                self._observe(snapshot)
            return self._families(snapshot)

    def _families(self, snapshot: Snapshot) -> list[Family]:
        present = {s.device.uuid for s in snapshot.devices}
        for key in [k for k in self._counters if k[0] not in present]:
            del self._counters[key]  # a device gone: its rates go with it
        families = [Family(col.name, col.type, col.help) for col in self.values]
        rows = self._rows(snapshot)
        # DCGM's health checks watch whole GPUs, whatever the device selection
        gpu_rows = [_Row(s, s) for s in snapshot.devices if not s.device.is_mig]
        labels: dict[str, tuple[dict[str, str], list[dict[str, str]]]] = {}
        for row in (*rows, *gpu_rows):
            if row.sample.device.uuid not in labels:
                labels[row.sample.device.uuid] = (self._labels(row, snapshot),
                                                  self._copies(row.sample, snapshot))
        for col, family in zip(self.values, families, strict=True):
            health = isinstance(col, ExporterField) and col.kind == "health"
            for row in gpu_rows if health else rows:
                if row.sample.state == FAILED and not health:
                    continue
                base, copies = labels[row.sample.device.uuid]
                for extra, value in self._points(col, row, snapshot):
                    for pods in copies:
                        attributes = {**pods, **extra}
                        family.add({**base, **{k: attributes[k] for k in sorted(attributes)}},
                                   value)
        return families

    def _points(self, col: Column, row: _Row,
                snapshot: Snapshot) -> list[tuple[dict[str, str], float]]:
        """(labels beyond the device's, value) of each series ``col`` has for ``row``."""
        if isinstance(col, ExporterField):
            return self._exporter(col, row, snapshot.taken_monotonic)
        if not isinstance(col, DcgmField):
            return []
        value = self._value(col, row, snapshot)
        if value is None:
            return []
        return [(dict(col.extra_labels(value)) if col.extra_labels else {}, value)]
