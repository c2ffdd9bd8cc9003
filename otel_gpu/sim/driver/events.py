"""Event sets: XID errors delivered to whoever registered for them, once each.

An event set remembers, per GPU, the event mask and the sample it first
registered at; a scenario ``xid`` due no earlier than that sample and no
later than the current one is handed out once per set, oldest first. A wait
with nothing due blocks through the injected ``sleep`` and then TIMEOUTs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import pynvml

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import (
    DriverCore,
    Fail,
    arg_int,
    c_symbol,
    deref,
    gpu_token,
    token_of,
    write_handle,
)
from otel_gpu.sim.scenario import GpuSpec, Xid

_EVENT_SET_BASE = 0x7E000000


@dataclass
class EventSet:
    registered: dict[int, tuple[int, int]] = field(default_factory=dict)
    """GPU index -> (event type mask, sample at first registration)."""
    delivered: set[tuple[int, int]] = field(default_factory=set)
    """(GPU index, position in its xid list) already handed out."""


class EventSymbols(DriverCore):
    def _event_set(self, handle: Any) -> EventSet:
        event_set = self._event_sets.get(token_of(handle) or 0)
        if event_set is None:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        return event_set

    @c_symbol(system=True)
    def nvmlEventSetCreate(self, out: Any) -> None:
        self.check_system("nvmlEventSetCreate")
        with self._lock:
            self._next_event_set += 1
            token = _EVENT_SET_BASE + self._next_event_set
            self._event_sets[token] = EventSet()
        write_handle(out, token)

    @c_symbol
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: Any, event_set: Any) -> None:
        target, sample = self.check_device("nvmlDeviceRegisterEvents", handle)
        mask = arg_int(event_types)
        with self._lock:
            es = self._event_set(event_set)
            old_mask, since = es.registered.get(target.gpu.index, (0, sample))
            es.registered[target.gpu.index] = (old_mask | mask, since)

    def _next_event(self, es: EventSet) -> tuple[GpuSpec, Xid] | None:
        with self._lock:
            sample = self._sample
            best: tuple[int, int, int] | None = None
            for index, (mask, since) in es.registered.items():
                if not mask & abi.nvmlEventTypeXidCriticalError:
                    continue
                for n, xid in enumerate(self.scenario.devices[index].xid):
                    if since <= xid.sample <= sample and (index, n) not in es.delivered:
                        candidate = (xid.sample, index, n)
                        if best is None or candidate < best:
                            best = candidate
            if best is None:
                return None
            _, index, n = best
            es.delivered.add((index, n))
            gpu = self.scenario.devices[index]
            return gpu, gpu.xid[n]

    @c_symbol(system=True)
    def nvmlEventSetWait_v2(self, event_set: Any, data_ref: Any, timeout_ms: Any) -> None:
        self.check_system("nvmlEventSetWait_v2")
        with self._lock:
            es = self._event_set(event_set)
        event = self._next_event(es)
        timeout = arg_int(timeout_ms)
        if event is None and timeout > 0:
            self._sleep(timeout / 1000)
            event = self._next_event(es)
        if event is None:
            raise Fail(abi.NVML_ERROR_TIMEOUT)
        gpu, xid = event
        data = deref(data_ref)
        data.device = ctypes.cast(ctypes.c_void_p(gpu_token(gpu.index)), pynvml.c_nvmlDevice_t)
        data.eventType = abi.nvmlEventTypeXidCriticalError
        data.eventData = xid.code
        data.gpuInstanceId = xid.gpu_instance_id
        data.computeInstanceId = xid.compute_instance_id

    @c_symbol(system=True)
    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.check_system("nvmlEventSetFree")
        with self._lock:
            self._event_set(event_set)
            token = token_of(event_set)
            if token is not None:  # _event_set refused any other
                del self._event_sets[token]
