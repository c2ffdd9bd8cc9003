"""Discovery and sampling: the only place NVML is read.

One :meth:`Sampler.sample` pass reads every device once and returns an
immutable :class:`~otel_gpu.snapshot.Snapshot`: discovery (GPUs, MIG
instances, XID event registration), one batched field-value call per device,
one call per :class:`~otel_gpu.nvml.sources.Reader` the catalog needs, and
the XID events waiting. :mod:`otel_gpu.pipeline` runs passes on an interval;
nothing on the scrape path calls into here.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from otel_gpu._log import LogLimiter
from otel_gpu.catalog import CATALOG, Metric, all_sources
from otel_gpu.nvml.library import Nvml, Outcome, Result, classify, error_name
from otel_gpu.nvml.sources import REMAP_FAILURE, REMAP_PENDING, Reader, Source
from otel_gpu.snapshot import (
    DEGRADED,
    FAILED,
    OK,
    PREDICTED_FAILURE,
    Device,
    DeviceSample,
    Snapshot,
)

log = logging.getLogger(__name__)

_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _field_value(entry: Any) -> float | None:
    kind = int(entry.valueType)
    if 0 <= kind < len(_VALUE_MEMBERS):
        return float(getattr(entry.value, _VALUE_MEMBERS[kind]))
    return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _token(handle: Any) -> int | None:
    """A handle's address: how an event's device is matched to a known handle."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def mig_profile(name: str) -> str | None:
    """``NVIDIA A100-SXM4-40GB MIG 1g.5gb`` -> ``1g.5gb``."""
    _, sep, profile = name.partition(" MIG ")
    if not sep:
        return None
    return profile.strip() or None


@dataclass
class _Tracked:
    """Sampler-private state of one device across samples."""

    device: Device
    handle: Any
    parent: _Tracked | None = None
    unsupported: set[str] = field(default_factory=set)
    xid: Counter = field(default_factory=Counter)
    last_xid: int | None = None
    failure: str | None = None
    events_registered: bool = False

    def label(self) -> str:
        if self.device.is_mig:
            return f"GPU {self.device.index} MIG {self.device.mig_profile} ({self.device.uuid})"
        return f"GPU {self.device.index} ({self.device.uuid})"


class Sampler:
    """Reads every GPU and MIG instance once per :meth:`sample` call."""

    def __init__(
        self,
        nvml: Nvml,
        catalog: Iterable[Metric] = CATALOG,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_events: int = 256,
        rediscover_every: int = 60,
    ) -> None:
        self._nvml = nvml
        self._m = nvml.module
        sources = all_sources(catalog)
        self._fields: tuple[Source, ...] = tuple(s for s in sources if s.field_id is not None)
        self._readers: tuple[Reader, ...] = tuple(
            dict.fromkeys(s.reader for s in sources if s.reader is not None)
        )
        self._clock = clock
        self._wall = wall_clock
        self._max_events = max_events
        self._rediscover_every = max(1, rediscover_every)
        self._devices: list[_Tracked] = []
        self._by_token: dict[int, _Tracked] = {}
        self._known_count: int | None = None
        self._discovery_incomplete = False
        self._driver_version: str | None = None
        self._event_set: Any = None
        self._seq = 0
        self._limited = LogLimiter(log, 300.0, clock=clock)

    # --- discovery -------------------------------------------------------------

    def _get(self, func: Callable[..., Any], *args: Any) -> Any:
        """A discovery read whose failure just leaves the attribute unknown."""
        res = self._nvml.call(func, *args)
        return res.value if res.ok else None

    def _discover(self, count: int, problems: list[str]) -> None:
        m = self._m
        previous = {t.device.uuid: t for t in self._devices}
        found: list[_Tracked] = []
        self._discovery_incomplete = False
        if self._driver_version is None:
            version = self._get(m.nvmlSystemGetDriverVersion)
            self._driver_version = _text(version) if version is not None else None
        for index in range(count):
            res = self._nvml.call(m.nvmlDeviceGetHandleByIndex, index)
            uuid = self._get(m.nvmlDeviceGetUUID, res.value) if res.ok else None
            if uuid is None:
                why = res.message or "no UUID"
                problems.append(f"GPU {index} could not be opened: {why}")
                self._limited.log(("discover", index), logging.WARNING,
                              "GPU %d could not be opened (%s); retrying on the next sample",
                              index, why)
                self._discovery_incomplete = True
                continue
            gpu = self._describe_gpu(index, res.value, _text(uuid))
            found.append(previous.get(gpu.device.uuid, gpu))
            found[-1].handle = res.value
            found.extend(self._discover_mig(found[-1], previous))
        added = [t.device.uuid for t in found if t.device.uuid not in previous]
        if previous and added:
            log.warning("new devices appeared: %s", ", ".join(added))
        gone = [uuid for uuid in previous if uuid not in {t.device.uuid for t in found}]
        if gone:
            log.warning("devices no longer listed by NVML: %s", ", ".join(gone))
        self._devices = found
        self._by_token = {}
        for t in found:
            token = _token(t.handle)
            if token is not None and not t.device.is_mig:
                self._by_token[token] = t
        self._known_count = count
        self._register_events()
        log.log(
            logging.INFO if added or gone or not previous else logging.DEBUG,
            "discovered %d GPU(s) and %d MIG instance(s); driver %s",
            sum(1 for t in found if not t.device.is_mig),
            sum(1 for t in found if t.device.is_mig),
            self._driver_version or "unknown",
        )

    def _describe_gpu(self, index: int, handle: Any, uuid: str) -> _Tracked:
        m = self._m
        name = _text(self._get(m.nvmlDeviceGetName, handle) or "NVIDIA GPU")
        pci = self._get(m.nvmlDeviceGetPciInfo, handle)
        numa = self._get(m.nvmlDeviceGetNumaNodeId, handle)
        serial = self._get(m.nvmlDeviceGetSerial, handle)
        device = Device(
            uuid=uuid,
            index=index,
            name=name,
            model=name,
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            minor_number=self._get(m.nvmlDeviceGetMinorNumber, handle),
            numa_node=numa if isinstance(numa, int) and numa >= 0 else None,
            serial=_text(serial) if serial else None,
        )
        return _Tracked(device, handle)

    def _discover_mig(self, gpu: _Tracked, previous: Mapping[str, _Tracked]) -> list[_Tracked]:
        m = self._m
        mode = self._nvml.call(m.nvmlDeviceGetMigMode, gpu.handle)
        if not mode.ok or mode.value[0] != m.NVML_DEVICE_MIG_ENABLE:
            return []
        slots = self._get(m.nvmlDeviceGetMaxMigDeviceCount, gpu.handle) or 0
        out = []
        for slot in range(slots):
            res = self._nvml.call(m.nvmlDeviceGetMigDeviceHandleByIndex, gpu.handle, slot)
            if not res.ok:
                continue  # empty slot
            uuid = self._get(m.nvmlDeviceGetUUID, res.value)
            if uuid is None:
                continue
            name = _text(self._get(m.nvmlDeviceGetName, res.value) or gpu.device.name)
            device = replace(
                gpu.device,
                uuid=_text(uuid),
                name=name,
                parent_uuid=gpu.device.uuid,
                gpu_instance_id=self._get(m.nvmlDeviceGetGpuInstanceId, res.value),
                compute_instance_id=self._get(m.nvmlDeviceGetComputeInstanceId, res.value),
                mig_profile=mig_profile(name),
                serial=None,
            )
            tracked = previous.get(device.uuid) or _Tracked(device, res.value)
            tracked.handle = res.value
            tracked.parent = gpu
            out.append(tracked)
        return out

    def _register_events(self) -> None:
        m = self._m
        if self._event_set is None:
            res = self._nvml.call(m.nvmlEventSetCreate)
            if not res.ok:
                self._limited.once("eventset", logging.INFO,
                           "XID events unavailable (%s); nvidia.gpu.xid.errors is not reported",
                           res.message)
                return
            self._event_set = res.value
        for t in self._devices:
            if t.device.is_mig or "xid" in t.unsupported or t.events_registered:
                continue
            res = self._nvml.call(
                m.nvmlDeviceRegisterEvents, t.handle, m.nvmlEventTypeXidCriticalError,
                self._event_set,
            )
            t.events_registered = res.ok
            if not res.ok:
                t.unsupported.add("xid")
                self._limited.once((t.device.uuid, "xid"), logging.INFO,
                           "%s: XID events not available (%s)", t.label(), res.message)

    # --- sampling --------------------------------------------------------------

    def sample(self) -> Snapshot:
        """Read everything once. Never raises for a driver error."""
        started = self._clock()
        problems: list[str] = []
        count = self._nvml.call(self._m.nvmlDeviceGetCount)
        if count.ok:
            # Periodic rediscovery catches MIG layouts changed at run time and GPUs
            # that came back after a reset; the count alone would miss both.
            periodic = self._seq > 0 and self._seq % self._rediscover_every == 0
            if count.value != self._known_count or self._discovery_incomplete or periodic:
                if self._known_count is not None and count.value != self._known_count:
                    log.warning("NVML now reports %d GPU(s), was %d",
                                count.value, self._known_count)
                self._discover(count.value, problems)
        else:
            problems.append(f"nvmlDeviceGetCount failed: {count.message}")
            self._limited.log("count", logging.WARNING, "nvmlDeviceGetCount failed: %s",
                              count.message)
        if count.ok and count.value == 0:
            problems.append("NVML reports no GPU")
        self._drain_events()
        samples = tuple(self._read(t) for t in self._devices)
        self._seq += 1
        finished = self._clock()
        return Snapshot(
            seq=self._seq,
            taken_at=self._wall(),
            taken_monotonic=finished,
            duration=finished - started,
            driver_version=self._driver_version,
            devices=samples,
            nvml_calls=self._nvml.calls,
            errors=tuple(problems),
        )

    def _drain_events(self) -> None:
        if self._event_set is None:
            return
        m = self._m
        for _ in range(self._max_events):
            res = self._nvml.call(m.nvmlEventSetWait_v2, self._event_set, 0)
            if not res.ok:
                if res.code != m.NVML_ERROR_TIMEOUT:
                    self._limited.log("events", logging.WARNING, "reading XID events failed: %s",
                                  res.message)
                return
            tracked = self._by_token.get(_token(res.value.device))
            if tracked is None:
                continue
            code = int(res.value.eventData)
            tracked.xid[code] += 1
            tracked.last_xid = code
            log.warning("%s reported XID %d", tracked.label(), code)

    def _read(self, t: _Tracked) -> DeviceSample:
        values: dict[str, float] = {}
        newly_unsupported: list[str] = []
        failure = t.parent.failure if t.parent is not None else None
        if failure is None:
            failure = self._read_fields(t, values, newly_unsupported) or self._read_calls(
                t, values, newly_unsupported
            )
        if newly_unsupported:  # each (device, value) pair is reported once, in one line
            log.info("%s: not available, omitted from now on: %s",
                     t.label(), ", ".join(newly_unsupported))
        if failure is not None and t.failure is None:
            log.error("%s failed: %s; its series are dropped and hw.status reports failed",
                      t.label(), failure)
        elif failure is None and t.failure is not None:
            log.warning("%s is readable again", t.label())
        t.failure = failure
        return DeviceSample(
            device=t.device,
            state=self._state(failure, values),
            values=MappingProxyType(values) if failure is None else MappingProxyType({}),
            xid_counts=MappingProxyType(dict(t.xid)),
            last_xid=t.last_xid,
            error=failure,
        )

    @staticmethod
    def _state(failure: str | None, values: Mapping[str, float]) -> str:
        if failure is not None:
            return FAILED
        if values.get(REMAP_FAILURE.key):
            return PREDICTED_FAILURE
        if values.get(REMAP_PENDING.key):
            return DEGRADED
        return OK

    def _outcome(self, t: _Tracked, what: str, res: Result, unsupported: list[str]) -> str | None:
        """Act on a failed read; returns the failure text when the device failed."""
        if res.outcome is Outcome.DEVICE_FAILED:
            return f"{res.message} ({error_name(res.code, self._m)}) in {what}"
        if res.outcome is Outcome.UNSUPPORTED:
            t.unsupported.add(what)
            unsupported.append(f"{what} ({error_name(res.code, self._m)})")
        else:
            self._limited.log((t.device.uuid, what), logging.WARNING,
                          "%s: reading %s failed (%s); retrying next sample",
                          t.label(), what, res.message)
        return None

    def _read_fields(
        self, t: _Tracked, values: dict[str, float], unsupported: list[str]
    ) -> str | None:
        wanted = [s for s in self._fields if s.key not in t.unsupported]
        if not wanted or "fields" in t.unsupported:
            return None
        m = self._m
        res = self._nvml.call(m.nvmlDeviceGetFieldValues, t.handle, [s.field_id for s in wanted])
        if not res.ok:
            return self._outcome(t, "fields", res, unsupported)
        for src, entry in zip(wanted, res.value, strict=False):
            code = int(entry.nvmlReturn)
            if code == m.NVML_SUCCESS:
                value = _field_value(entry)
                if value is not None:
                    values[src.key] = value
                continue
            failure = self._outcome(
                t, src.key, Result(None, classify(code, m), code, error_name(code, m)), unsupported
            )
            if failure is not None:
                return failure
        return None

    def _read_calls(
        self, t: _Tracked, values: dict[str, float], unsupported: list[str]
    ) -> str | None:
        for reader in self._readers:
            if reader.name in t.unsupported:
                continue
            res = self._nvml.call(reader.read, self._m, t.handle)
            if res.ok:
                values.update(res.value)
                continue
            failure = self._outcome(t, reader.name, res, unsupported)
            if failure is not None:
                return failure
        return None
