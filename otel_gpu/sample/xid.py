"""XID events: one NVML event set for the node, each GPU registered into it once.

The event set is made and drained on the sampler thread (it is not a GPU's
call); a GPU's registration is a call on that GPU, so discovery makes it on
the GPU's worker thread (:meth:`XidEvents.register`) and the sampler thread
applies its answer (:meth:`XidEvents.registered`). A storm of events is
counted in full but logged at most once a minute per GPU and code, with the
count of the lines held back.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping
from typing import Any

from otel_gpu._clock import SYSTEM, Clock
from otel_gpu._log import LogLimiter
from otel_gpu.sample.device import Tracked
from otel_gpu.sample.library import Nvml, Result
from otel_gpu.sample.workers import DeviceWorker
from otel_gpu.snapshot import XidEvent

log = logging.getLogger(__name__)

COMMON_XIDS = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 140)
"""XIDs whose series exist at 0 from discovery on, so the first one is an increase."""
NO_INSTANCE = 0xFFFFFFFF
"""What NVML puts in an XID event's GPU/compute instance id when none applies."""
LOG_EVERY = 60.0
"""Seconds between two log lines of one GPU's one XID code."""


def token(handle: Any) -> int | None:
    """A handle's address: how an event's device is matched to a known handle."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _instance_id(value: Any) -> int | None:
    """An XID event's MIG instance id, or ``None`` when NVML gave none."""
    return None if value is None or int(value) == NO_INSTANCE else int(value)


class XidEvents:
    """The node's XID event set and what it delivered."""

    def __init__(self, nvml: Nvml, *, max_events: int = 256,
                 clock: Clock = SYSTEM) -> None:
        self._nvml = nvml
        self._m = nvml.module
        self._max_events = max_events
        self._wall = clock.wall
        self._event_set: Any = None
        self._limited = LogLimiter(log, 300.0, clock=clock)
        self._storm = LogLimiter(log, LOG_EVERY, clock=clock)
        self._by_token: dict[int, Tracked] = {}

    def ready(self) -> bool:
        """Make the event set once (sampler thread); False when the driver has none."""
        if self._event_set is None:
            res = self._nvml.call(self._m.nvmlEventSetCreate)
            if not res.ok:
                self._limited.once("eventset", logging.INFO,
                                   "XID events unavailable (%s); nvidia.gpu.xid.errors is not "
                                   "reported", res.message)
                return False
            self._event_set = res.value
        return True

    @property
    def is_ready(self) -> bool:
        """Whether the event set exists (made by :meth:`ready`)."""
        return self._event_set is not None

    def wanted(self, t: Tracked | None) -> bool:
        """Whether discovery should register this GPU (``None``: one not seen before) now."""
        return self._event_set is not None and (
            t is None or not (t.xid.registered or t.xid.unavailable))

    def register(self, handle: Any) -> Result:
        """The registration call, on the GPU's worker thread."""
        return self._nvml.call(self._m.nvmlDeviceRegisterEvents, handle,
                               self._m.nvmlEventTypeXidCriticalError, self._event_set)

    def registered(self, t: Tracked, res: Result) -> None:
        """Apply a registration's answer (sampler thread)."""
        t.xid.registered = res.ok
        if res.ok:  # every common XID has a series from now on, at 0 until it happens
            t.xid.counts.update(dict.fromkeys(COMMON_XIDS, 0))
        else:
            t.xid.unavailable = True
            self._limited.once((t.device.uuid, "xid"), logging.INFO,
                               "%s: XID events not available (%s)", t.label(), res.message)

    def track(self, devices: Mapping[int, Tracked]) -> None:
        """The GPUs events are matched to, by handle address."""
        self._by_token = dict(devices)

    def collect(self, worker: DeviceWorker) -> list[tuple[int, int, int | None, int | None]]:
        """The events waiting, at most ``max_events`` per sample, as (device token, code, GPU
        instance, compute instance): on the node's worker, so a wait that never returns
        holds no GPU; :meth:`apply` hands them to their GPUs on the sampler thread."""
        found: list[tuple[int, int, int | None, int | None]] = []
        if self._event_set is None:
            return found
        m = self._m
        for _ in range(self._max_events):
            with worker.doing("nvmlEventSetWait"):
                res = self._nvml.call(m.nvmlEventSetWait_v2, self._event_set, 0)
            if not res.ok:
                if res.code != m.NVML_ERROR_TIMEOUT:
                    self._limited.log("events", logging.WARNING,
                                      "reading XID events failed: %s", res.message)
                return found
            found.append((token(res.value.device) or 0, int(res.value.eventData),
                          _instance_id(getattr(res.value, "gpuInstanceId", None)),
                          _instance_id(getattr(res.value, "computeInstanceId", None))))
        return found

    def apply(self, found: list[tuple[int, int, int | None, int | None]]) -> None:
        """Count what :meth:`collect` found on the GPUs it names (sampler thread)."""
        for key, code, gpu_instance, compute_instance in found:
            tracked = self._by_token.get(key)
            if tracked is None:
                continue
            xid = tracked.xid
            xid.counts[code] += 1
            xid.last = code
            xid.pending.append(XidEvent(code, self._wall(), gpu_instance, compute_instance))
            self._storm.log((tracked.device.uuid, code), logging.WARNING,
                            "%s reported XID %d", tracked.label(), code)
