"""The GPU time ledger's two signals as records: an idle allocation, and use outside any.

An allocation idle for the ``idle_threshold`` setting starts an episode (one record under
its workload's Resource: its attributes are the pod's, container's or job's) and ends
when the holder uses the device again or stops holding it. A device used outside any
allocation starts one per kind of use (:data:`otel_gpu.attribute.gputime.OUTSIDE_KINDS`)
and ends when that use stops. Both go through the detector, so its cap per sample holds.
"""

from __future__ import annotations

from collections.abc import Iterator

from otel_gpu.attribute.gputime import holder_shares
from otel_gpu.export.events.records import (
    END,
    EVENT_DURATION,
    EVENT_PHASE,
    INFO,
    START,
    WARN,
    Event,
)
from otel_gpu.instrument.attributes import device_attributes, kubelet_numa_node
from otel_gpu.instrument.gputime import OUTSIDE_KIND
from otel_gpu.snapshot import Snapshot
from otel_gpu.workload import Workload

IDLE = "nvidia.gpu.allocation.idle"
OUTSIDE = "nvidia.gpu.outside_allocation"
IDLE_FOR = "nvidia.gpu.idle.duration"

_WHO = {"unallocated_device": "a process on a device no workload holds",
        "other_workload": "a workload's process on a device allocated to another",
        "host": "a process in no workload on a held device"}


class WorkloadEvents:
    """The episodes of both signals, per (device, holder) and (device, kind)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, Workload], float] = {}
        """Idle allocations reported, and when (wall clock) each started."""
        self._outside: dict[tuple[str, str], float] = {}

    def detect(self, snapshot: Snapshot) -> Iterator[Event]:
        ledger = snapshot.gpu_time
        if ledger is None:
            return
        now = snapshot.taken_at
        samples = {s.device.uuid: s for s in snapshot.devices}
        rows = {(h.uuid, h.holder): h for h in ledger.holders}
        for key, row in rows.items():
            if key in self._idle or row.idle_s is None or row.idle_s < ledger.idle_threshold_s:
                continue
            self._idle[key] = now - row.idle_s
            yield self._event(snapshot, samples, key, IDLE, WARN, START, now,
                              f"{_name(key[1])} has held {key[0]} idle for "
                              f"{row.idle_s / 60:.0f} min", {IDLE_FOR: round(row.idle_s, 3)})
        for key in list(self._idle):
            now_row = rows.get(key)
            held = key[0] in samples and key[1] in holder_shares(snapshot, key[0])
            if held and now_row is not None and (now_row.idle_s is None or now_row.idle_s > 0):
                continue
            since = self._idle.pop(key)
            why = "uses it again" if held else "no longer holds it"
            yield self._event(snapshot, samples, key, IDLE, INFO, END, now,
                              f"{_name(key[1])} {why} ({key[0]})",
                              {EVENT_DURATION: round(max(0.0, now - since), 3)})
        current = {(d.uuid, kind) for d in ledger.devices for kind in d.outside_now}
        for uuid, kind in sorted(current - set(self._outside)):
            self._outside[(uuid, kind)] = now
            yield self._device_event(snapshot, samples, uuid, kind, WARN, START, now,
                                     f"{uuid} is used outside any allocation: {_WHO[kind]}", {})
        for uuid, kind in sorted(set(self._outside) - current):
            since = self._outside.pop((uuid, kind))
            yield self._device_event(snapshot, samples, uuid, kind, INFO, END, now,
                                     f"{uuid} is no longer used outside any allocation "
                                     f"({_WHO[kind]})",
                                     {EVENT_DURATION: round(max(0.0, now - since), 3)})

    @staticmethod
    def _base(snapshot: Snapshot, samples: dict, uuid: str) -> dict[str, object]:
        sample = samples.get(uuid)
        if sample is None:
            return {"hw.id": uuid}
        device = sample.device
        return dict(device_attributes(device, snapshot.driver_version,
                                      kubelet_numa_node(snapshot, device)))

    def _event(self, snapshot: Snapshot, samples: dict, key: tuple[str, Workload], name: str,
               severity: str, phase: str, now: float, body: str,
               extra: dict[str, object]) -> Event:
        attrs = self._base(snapshot, samples, key[0])
        attrs.update(key[1].attributes())
        attrs.update(extra)
        attrs[EVENT_PHASE] = phase
        return Event(name, severity, body, now, attrs)

    def _device_event(self, snapshot: Snapshot, samples: dict, uuid: str, kind: str,
                      severity: str, phase: str, now: float, body: str,
                      extra: dict[str, object]) -> Event:
        attrs = self._base(snapshot, samples, uuid)
        attrs.update(snapshot.workload_attributes(uuid))
        attrs.update(extra)
        attrs[OUTSIDE_KIND] = kind
        attrs[EVENT_PHASE] = phase
        return Event(OUTSIDE, severity, body, now, attrs)


def _name(holder: Workload) -> str:
    return " ".join(f"{k}={v}" for k, v in holder.attributes().items())
