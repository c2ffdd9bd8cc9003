"""Discovery and sampling: the only place NVML is read.

One :class:`Sampler` pass reads every device once and returns an immutable
:class:`~otel_gpu.snapshot.Snapshot`. The :class:`SamplerThread` runs passes
on an interval and publishes them to a :class:`SnapshotStore`; instrument
callbacks and scrapes read the store and never touch the driver, so ten
scrapers cost NVML no more than one, and a hung driver shows as a growing
``otel_gpu.sample.age`` instead of a hung scrape.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType, ModuleType
from typing import Any

from otel_gpu._log import LogLimiter
from otel_gpu.catalog import CATALOG, REMAP_FAILURE, REMAP_PENDING, Metric, Source, all_sources
from otel_gpu.nvml.library import Nvml, Outcome, Result, classify, error_name
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

# --- readers: one NVML call each, returning raw values by source key ---------


def _older_driver(m: ModuleType, exc: Exception) -> bool:
    """Whether a newer NVML entry point is missing, so its older form should be used."""
    return getattr(exc, "value", None) in (
        m.NVML_ERROR_FUNCTION_NOT_FOUND, m.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    )


def _memory(m: ModuleType, handle: Any) -> dict[str, float]:
    try:
        mem = m.nvmlDeviceGetMemoryInfo(handle, version=m.nvmlMemory_v2)
        reserved: float | None = mem.reserved
    except m.NVMLError as exc:  # drivers before R510 have only the v1 call
        if not _older_driver(m, exc):
            raise
        mem = m.nvmlDeviceGetMemoryInfo(handle)
        reserved = None
    out = {"memory.total": mem.total, "memory.used": mem.used, "memory.free": mem.free}
    if reserved is not None:
        out["memory.reserved"] = reserved
    return out


def _temperature(m: ModuleType, handle: Any) -> dict[str, float]:
    try:
        value = m.nvmlDeviceGetTemperatureV(handle, m.NVML_TEMPERATURE_GPU)
    except m.NVMLError as exc:  # the versioned call arrived with R535
        if not _older_driver(m, exc):
            raise
        value = m.nvmlDeviceGetTemperature(handle, m.NVML_TEMPERATURE_GPU)
    return {"temp.gpu": value}


def _utilization(m: ModuleType, handle: Any) -> dict[str, float]:
    util = m.nvmlDeviceGetUtilizationRates(handle)
    return {"util.gpu": util.gpu, "util.memory": util.memory}


_CLOCK_TYPES = {
    "graphics": "NVML_CLOCK_GRAPHICS", "sm": "NVML_CLOCK_SM", "memory": "NVML_CLOCK_MEM"
}


def _clock(domain: str) -> Callable[[ModuleType, Any], dict[str, float]]:
    def read(m: ModuleType, handle: Any) -> dict[str, float]:
        clock_type = getattr(m, _CLOCK_TYPES[domain])
        return {f"clock.{domain}": m.nvmlDeviceGetClockInfo(handle, clock_type)}

    return read


READERS: Mapping[str, Callable[[ModuleType, Any], Mapping[str, float]]] = MappingProxyType({
    "memory": _memory,
    "utilization": _utilization,
    "encoder": lambda m, h: {"util.encoder": m.nvmlDeviceGetEncoderUtilization(h)[0]},
    "decoder": lambda m, h: {"util.decoder": m.nvmlDeviceGetDecoderUtilization(h)[0]},
    "temperature": _temperature,
    "power": lambda m, h: {"power": m.nvmlDeviceGetPowerUsage(h)},
    "clock.graphics": _clock("graphics"),
    "clock.sm": _clock("sm"),
    "clock.memory": _clock("memory"),
    "clock_reasons": lambda m, h: {"clock.reasons": m.nvmlDeviceGetCurrentClocksEventReasons(h)},
    "fan": lambda m, h: {"fan": m.nvmlDeviceGetFanSpeed(h)},
    "processes": lambda m, h: {"processes": len(m.nvmlDeviceGetComputeRunningProcesses(h))},
})

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
        self._readers: tuple[str, ...] = tuple(
            dict.fromkeys(s.reader for s in sources if s.reader is not None)
        )
        unknown = [r for r in self._readers if r not in READERS]
        if unknown:
            raise ValueError(f"catalog names readers the sampler lacks: {unknown}")
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
        for name in self._readers:
            if name in t.unsupported:
                continue
            res = self._nvml.call(READERS[name], self._m, t.handle)
            if res.ok:
                values.update(res.value)
                continue
            failure = self._outcome(t, name, res, unsupported)
            if failure is not None:
                return failure
        return None


class SnapshotStore:
    """Holds the latest snapshot; readers take it without waiting on the sampler."""

    def __init__(self) -> None:
        self._latest: Snapshot | None = None
        self._version = 0
        self._cond = threading.Condition()

    @property
    def latest(self) -> Snapshot | None:
        return self._latest

    @property
    def version(self) -> int:
        """Counts publications: changes when a new sample or new pods arrive."""
        return self._version

    def publish(self, snapshot: Snapshot) -> None:
        with self._cond:
            self._latest = snapshot
            self._version += 1
            self._cond.notify_all()

    def wait_for(self, seq: int, timeout: float) -> Snapshot | None:
        """Block until a snapshot numbered ``seq`` or later exists (for tests)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._latest is not None and self._latest.seq >= seq, timeout
            )
            return self._latest


class SamplerThread:
    """Runs :meth:`Sampler.sample` every ``interval`` seconds until stopped.

    Each new snapshot goes to ``publish``. A sample that raises (a bug, not a
    driver error: those never raise) is logged at most once a minute and
    retried with exponential backoff, capped at ``max_backoff``; the thread
    itself never dies of it.
    """

    def __init__(
        self,
        sampler: Sampler,
        publish: Callable[[Snapshot], None],
        interval: float,
        *,
        max_backoff: float = 300.0,
    ) -> None:
        self._sampler = sampler
        self._publish = publish
        self._interval = interval
        self._max_backoff = max(max_backoff, interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-gpu-sampler", daemon=True)
        self._limited = LogLimiter(log, 60.0)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Whether the thread has ended (False: still inside an NVML call)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._publish(self._sampler.sample())
                failures = 0
                wait = self._interval - (time.monotonic() - started)
            except Exception:  # noqa: BLE001 - the loop must outlive any bug
                failures += 1
                wait = min(self._interval * 2 ** min(failures, 16), self._max_backoff)
                self._limited.log("sample", logging.ERROR,
                                  "sampling failed (%d in a row); next try in %.0f s",
                                  failures, wait, exc_info=True)
            self._stop.wait(max(0.0, wait))
