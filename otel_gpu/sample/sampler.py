"""Discovery and sampling: the only place NVML is read.

One :meth:`Sampler.sample` pass reads every device once and returns an
immutable :class:`~otel_gpu.snapshot.Snapshot`: discovery (GPUs, MIG
instances, XID event registration), one batched field-value call per device
(:mod:`otel_gpu.sample.batch`), one call per
:class:`~otel_gpu.sample.sources.Reader` the catalog needs (a static one once
per device; a field's fallback only where the driver does not answer the
field), one GPM profiling sample per device (:mod:`otel_gpu.sample.gpm`), and
the XID events waiting.
:mod:`otel_gpu.publish.pipeline` runs passes on an interval; nothing on the scrape
path calls into here.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from otel_gpu._log import LogLimiter
from otel_gpu.sample.batch import BatchReads
from otel_gpu.sample.gpm import GpmCollector, GpmState
from otel_gpu.sample.library import Nvml, Outcome, Result, error_name
from otel_gpu.sample.sources import (
    COMPUTE_PROCESSES,
    NVLINK_STATES,
    PROCESSES,
    REMAP_FAILURE,
    REMAP_PENDING,
    RETIRED_PENDING,
    Reader,
    Source,
)
from otel_gpu.sample.workers import DeviceWorker, Job
from otel_gpu.snapshot import (
    DEGRADED,
    FAILED,
    OK,
    PREDICTED_FAILURE,
    Device,
    DeviceSample,
    ProcessUsage,
    Snapshot,
    XidEvent,
)

log = logging.getLogger(__name__)

def _read_small(path: Path) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(64).strip()
    except OSError:
        return ""


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
    """Sampler-private state of one device across samples.

    ``unsupported``, ``failure`` and ``gpm`` are written by the device's worker
    thread only (``gpm``'s buffers are freed by the sampler thread, between
    jobs); ``xid`` by the sampler thread only.
    """

    device: Device
    handle: Any
    parent: _Tracked | None = None
    unsupported: set[str] = field(default_factory=set)
    xid: Counter = field(default_factory=Counter)
    last_xid: int | None = None
    xid_events: list[XidEvent] = field(default_factory=list)
    """XID events read since this device's last sample; handed on and emptied by it."""
    failure: str | None = None
    open_failure: str | None = None
    """Why NVML could not open the GPU at the last discovery (then ``handle`` is stale)."""
    state: str = OK
    values: Mapping[str, float] = field(default_factory=lambda: _NO_VALUES)
    read_at: float | None = None
    """Monotonic time the last read of this device finished."""
    hung_since: float | None = None
    events_registered: bool = False
    gpm: GpmState = field(default_factory=GpmState)
    processes: tuple[ProcessUsage, ...] | None = None
    """The last read's compute processes (process usage on); written by the worker thread."""
    process_utilization: bool = False
    utilization_seen: int = 0
    """NVML timestamp (us) of the newest per-process utilization sample read so far."""
    unbatched: set[str] = field(default_factory=set)
    """Fields this device's driver does not answer in the batch: their fallback call gives
    them from then on (decided once, on the first answer); written by the worker thread."""
    link_totals: dict[str, bool] = field(default_factory=dict)
    link_count: int = 0
    """NVLink links the GPU has (answered by the state call per link)."""
    active_links: tuple[int, ...] = ()
    """The NVLink links active at the last read: what the NVLink fields are asked for."""
    states_batched: bool | None = None
    """Whether the batch gives the link states as the calls per link do (None: not yet
    compared); written by the worker thread."""
    """Per NVLink-links field: whether the driver answers its all-links scope (else: summed)."""
    static: dict[str, Mapping[str, float]] = field(default_factory=dict)
    """The answers of the static readers, by reader name: read once."""
    kept: dict[str, tuple[tuple[float | None, ...], int, Mapping[str, float]]] = field(
        default_factory=dict)
    """The last answers of the readers with ``changes_with``, by reader name: (the values
    it depends on then, the sample it was read in, the answer)."""
    newly_unsupported: list[str] = field(default_factory=list)
    """Values found unsupported since the sampler last logged them: appended by the worker
    thread, logged and emptied by the sampler thread once the job is done."""

    def short_label(self) -> str:
        """``GPU 3``, or ``GPU 0 MIG 1g.10gb GI 9`` for a MIG instance."""
        if self.device.is_mig:
            return (f"GPU {self.device.index} MIG {self.device.mig_profile} "
                    f"GI {self.device.gpu_instance_id}")
        return f"GPU {self.device.index}"

    def label(self) -> str:
        if self.device.is_mig:
            return f"GPU {self.device.index} MIG {self.device.mig_profile} ({self.device.uuid})"
        return f"GPU {self.device.index} ({self.device.uuid})"


_NO_VALUES: Mapping[str, float] = MappingProxyType({})
_NAMED = 8
"""Devices named in one "not available" line; the rest are counted (a node may have 512)."""
COMMON_XIDS = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120)
"""XIDs whose series exist at 0 from discovery on, so the first one is an increase."""


_NO_INSTANCE = 0xFFFFFFFF
"""What NVML puts in an XID event's GPU/compute instance id when none applies."""


def _instance_id(value: Any) -> int | None:
    """An XID event's MIG instance id, or ``None`` when NVML gave none."""
    return None if value is None or int(value) == _NO_INSTANCE else int(value)


def unknown_uuid(index: int) -> str:
    """The ``hw.id`` of a GPU NVML counts but has never let us open: its index stands in."""
    return f"GPU-unknown-index-{index}"


class Sampler(BatchReads):
    """Reads every GPU and MIG instance once per :meth:`sample` call."""

    def __init__(
        self,
        nvml: Nvml,
        sources: Iterable[Source],
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_events: int = 256,
        rediscover_every: int = 60,
        read_timeout: float = 5.0,
        sysfs_root: Path | None = None,
        process_usage: bool = False,
    ) -> None:
        self._nvml = nvml
        self._process_usage = process_usage
        self._m = nvml.module
        sources = tuple(sources)
        self._fields: tuple[Source, ...] = tuple(s for s in sources if s.field_id is not None)
        # A field's fallback call is a reader too, read only where the field is not answered.
        self._readers: tuple[Reader, ...] = tuple(
            dict.fromkeys(r for s in sources for r in (s.reader, s.fallback)
                          if r is not None and r is not NVLINK_STATES)
        )
        # The link states are read before the fields: the NVLink fields need the active links.
        self._nvlink = any(s.nvlink is not None or s.reader is NVLINK_STATES for s in sources)
        self._clock = clock
        self._wall = wall_clock
        self._max_events = max_events
        self._rediscover_every = max(1, rediscover_every)
        self._devices: list[_Tracked] = []
        self._by_token: dict[int, _Tracked] = {}
        self._known_count: int | None = None
        self._unopened: set[int] = set()
        self._topology_changed = False
        self._read_timeout = read_timeout
        self._sysfs_root = sysfs_root
        self._workers: dict[str, DeviceWorker] = {}
        self._gone_codes = frozenset(
            getattr(self._m, name) for name in ("NVML_ERROR_INVALID_ARGUMENT",
                                                "NVML_ERROR_NOT_FOUND") if hasattr(self._m, name)
        )
        self._driver_version: str | None = None
        self._event_set: Any = None
        self._seq = 0
        self._limited = LogLimiter(log, 300.0, clock=clock)
        self._gpm = GpmCollector(nvml, sources, clock=clock)

    # --- discovery -------------------------------------------------------------

    def _get(self, func: Callable[..., Any], *args: Any) -> Any:
        """A discovery read whose failure just leaves the attribute unknown."""
        res = self._nvml.call(func, *args)
        return res.value if res.ok else None

    def _discover(self, count: int, problems: list[str]) -> None:
        m = self._m
        previous = {t.device.uuid: t for t in self._devices}
        gpus_by_index = {t.device.index: t for t in self._devices if not t.device.is_mig}
        found: list[_Tracked] = []
        self._unopened = set()
        self._topology_changed = False
        if self._driver_version is None:
            version = self._get(m.nvmlSystemGetDriverVersion)
            self._driver_version = _text(version) if version is not None else None
        for index in range(count):
            old = gpus_by_index.get(index)
            if old is not None and self._worker(old).busy:
                # A call on it is hung: asking NVML about it again would hang this thread too.
                found.append(old)
                found.extend(t for t in self._devices if t.parent is old)
                continue
            res = self._nvml.call(m.nvmlDeviceGetHandleByIndex, index)
            uuid = self._get(m.nvmlDeviceGetUUID, res.value) if res.ok else None
            if uuid is None:
                why = res.message or "no UUID"
                found.extend(self._unopenable(index, why, old, count, problems))
                continue
            # A GPU seen before keeps its identity: only a new one is described (six calls).
            known = previous.get(_text(uuid))
            found.append(known or self._describe_gpu(index, res.value, _text(uuid)))
            found[-1].handle = res.value
            found[-1].open_failure = None
            found.extend(self._discover_mig(found[-1], previous))
        kept = {t.device.uuid for t in found}
        added = [t.device.uuid for t in found if t.device.uuid not in previous]
        if previous and added:
            log.warning("new devices appeared: %s", ", ".join(added))
        gone = [uuid for uuid in previous if uuid not in kept]
        if gone:
            log.warning("devices no longer listed by NVML: %s", ", ".join(gone))
        for uuid in gone:
            self._release_gpm(previous[uuid])
        for uuid in gone:
            worker = self._workers.pop(uuid, None)
            if worker is not None:
                worker.close()
        self._devices = found
        self._by_token = {}
        for t in found:
            token = _token(t.handle) if t.open_failure is None else None
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

    def _unopenable(
        self, index: int, why: str, old: _Tracked | None, count: int, problems: list[str]
    ) -> list[_Tracked]:
        """A GPU NVML counts but cannot open: kept, and reported failed, never dropped.

        It keeps the identity it had (UUID, bus id, MIG instances) when it was
        seen before; a GPU lost since start gets its index and, where sysfs
        tells, its PCI bus id. Only its handle is asked for again each sample.
        """
        problems.append(f"GPU {index} could not be opened: {why}")
        self._limited.log(("discover", index), logging.WARNING,
                          "GPU %d could not be opened (%s); reported as failed and retried "
                          "every sample", index, why)
        self._unopened.add(index)
        if old is not None:
            old.open_failure = f"could not be opened: {why}"
            return [old, *(t for t in self._devices if t.parent is old)]
        device = Device(
            uuid=unknown_uuid(index), index=index, name="NVIDIA GPU", model="NVIDIA GPU",
            pci_bus_id=self._sysfs_bus_id(index, count) or "",
        )
        return [_Tracked(device, None, open_failure=f"could not be opened: {why}")]

    def _sysfs_bus_id(self, index: int, count: int) -> str | None:
        """NVML numbers GPUs in PCI bus order: the index-th NVIDIA display device in sysfs."""
        if self._sysfs_root is None:
            return None
        driver = self._sysfs_root / "sys" / "bus" / "pci" / "drivers" / "nvidia"
        try:
            gpus = sorted(
                entry.name for entry in driver.iterdir()
                if ":" in entry.name and _read_small(entry / "class").startswith("0x03")
            )
        except OSError:
            return None
        if len(gpus) != count or index >= len(gpus):
            return None  # some GPUs are hidden from this container: the order would lie
        domain, bus, devfn = gpus[index].split(":")
        return f"{int(domain, 16):08X}:{bus.upper()}:{devfn.upper()}"

    def _describe_gpu(self, index: int, handle: Any, uuid: str) -> _Tracked:
        m = self._m
        name = _text(self._get(m.nvmlDeviceGetName, handle) or "NVIDIA GPU")
        pci = self._get(m.nvmlDeviceGetPciInfo, handle)
        numa = self._get(m.nvmlDeviceGetNumaNodeId, handle)
        serial = self._get(m.nvmlDeviceGetSerial, handle)
        vbios = self._get(m.nvmlDeviceGetVbiosVersion, handle)
        device = Device(
            uuid=uuid,
            index=index,
            name=name,
            model=name,
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            minor_number=self._get(m.nvmlDeviceGetMinorNumber, handle),
            numa_node=numa if isinstance(numa, int) and numa >= 0 else None,
            serial=_text(serial) if serial else None,
            vbios_version=_text(vbios) if vbios else None,
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
            gi_id = self._get(m.nvmlDeviceGetGpuInstanceId, res.value)
            # The GPU instance's profile id and placement, as NVIDIA's DRA driver names it.
            gi = self._get(m.nvmlDeviceGetGpuInstanceById, gpu.handle, gi_id) if isinstance(
                gi_id, int) else None
            info = self._get(m.nvmlGpuInstanceGetInfo, gi) if gi is not None else None
            device = replace(
                gpu.device,
                uuid=_text(uuid),
                name=name,
                parent_uuid=gpu.device.uuid,
                gpu_instance_id=gi_id,
                compute_instance_id=self._get(m.nvmlDeviceGetComputeInstanceId, res.value),
                mig_profile=mig_profile(name),
                serial=None,
                vbios_version=None,
                gpu_instance_profile_id=int(info.profileId) if info is not None else None,
                placement_start=int(info.placement.start) if info is not None else None,
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
            if (t.device.is_mig or "xid" in t.unsupported or t.events_registered
                    or t.open_failure is not None):
                continue
            res = self._nvml.call(
                m.nvmlDeviceRegisterEvents, t.handle, m.nvmlEventTypeXidCriticalError,
                self._event_set,
            )
            t.events_registered = res.ok
            if res.ok:  # every common XID has a series from now on, at 0 until it happens
                t.xid.update(dict.fromkeys(COMMON_XIDS, 0))
            else:
                t.unsupported.add("xid")
                self._limited.once((t.device.uuid, "xid"), logging.INFO,
                           "%s: XID events not available (%s)", t.label(), res.message)

    # --- sampling --------------------------------------------------------------

    def sample(self) -> Snapshot:
        """Read everything once. Never raises for a driver error, never waits on a hung GPU."""
        started = self._clock()
        problems: list[str] = []
        count = self._nvml.call(self._m.nvmlDeviceGetCount)
        if count.ok:
            # Periodic rediscovery catches GPUs back after a reset and anything the
            # cheaper triggers miss; a MIG re-layout is caught on its first failing call.
            periodic = self._seq > 0 and self._seq % self._rediscover_every == 0
            if (count.value != self._known_count or periodic or self._topology_changed
                    or self._reopenable()):
                if self._known_count is not None and count.value != self._known_count:
                    log.warning("NVML now reports %d GPU(s), was %d",
                                count.value, self._known_count)
                self._discover(count.value, problems)
            else:
                problems.extend(f"GPU {i} could not be opened" for i in sorted(self._unopened))
        else:
            problems.append(f"nvmlDeviceGetCount failed: {count.message}")
            self._limited.log("count", logging.WARNING, "nvmlDeviceGetCount failed: %s",
                              count.message)
        if count.ok and count.value == 0:
            problems.append("NVML reports no GPU")
        self._drain_events()
        samples = self._read_all(problems)
        problems.extend(self._gpm.summary(self._devices))
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

    def busy(self) -> bool:
        """Whether an NVML call made for a device is still running (then NVML must stay up)."""
        return any(w.busy for w in self._workers.values())

    def close(self) -> None:
        """Lets the reader threads end (a hung one ends when its call returns)."""
        for t in self._devices:
            self._release_gpm(t)
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()

    def _release_gpm(self, t: _Tracked) -> None:
        """Free a device's GPM buffers, unless a call on its GPU still runs (then they stay)."""
        worker = self._workers.get((t.parent or t).device.uuid)
        if worker is None or not worker.busy:
            self._gpm.release(t.gpm)

    def _reopenable(self) -> bool:
        """Whether a GPU that could not be opened now can: two calls per such GPU."""
        m = self._m
        for index in sorted(self._unopened):
            res = self._nvml.call(m.nvmlDeviceGetHandleByIndex, index)
            if res.ok and self._get(m.nvmlDeviceGetUUID, res.value) is not None:
                return True
        return False

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
            tracked.xid_events.append(XidEvent(
                code, self._wall(),
                _instance_id(getattr(res.value, "gpuInstanceId", None)),
                _instance_id(getattr(res.value, "computeInstanceId", None)),
            ))
            log.warning("%s reported XID %d", tracked.label(), code)

    @staticmethod
    def _take_xids(t: _Tracked) -> tuple[XidEvent, ...]:
        """The device's XID events read since its last sample, handed on once."""
        events, t.xid_events = tuple(t.xid_events), []
        return events

    # --- reading, one worker thread per GPU -----------------------------------------------

    def _worker(self, gpu: _Tracked) -> DeviceWorker:
        worker = self._workers.get(gpu.device.uuid)
        if worker is None:
            worker = DeviceWorker(f"otel-gpu-read-{gpu.device.index}")
            self._workers[gpu.device.uuid] = worker
        return worker

    def _read_all(self, problems: list[str]) -> tuple[DeviceSample, ...]:
        """Each GPU (with its MIG instances) read on its own thread, all within one deadline."""
        groups: dict[str, list[_Tracked]] = {}
        for t in self._devices:
            head = t.parent or t
            groups.setdefault(head.device.uuid, []).append(t)
        now = self._clock()
        jobs: dict[str, Job] = {}
        for uuid, group in groups.items():
            worker = self._worker(group[0])
            if not worker.busy:
                jobs[uuid] = worker.submit(
                    lambda g=group, w=worker: [self._read(t, w) for t in g], now)
        deadline = now + self._read_timeout
        for job in jobs.values():
            job.done.wait(max(0.0, deadline - self._clock()))
        end = self._clock()
        out: list[DeviceSample] = []
        answered: list[_Tracked] = []
        for uuid, group in groups.items():
            job = jobs.get(uuid)
            if job is not None and job.done.is_set():
                if job.error is not None:
                    raise job.error  # a bug, not the driver: the pipeline logs and backs off
                self._answered(group[0], end)
                out.extend(self._sample_of(t, end) for t in job.result)
                answered.extend(job.result)
            else:
                out.extend(self._hung(t, self._worker(group[0]), end, problems) for t in group)
        self._log_unsupported(answered)
        return tuple(out)

    @staticmethod
    def _log_unsupported(devices: list[_Tracked]) -> None:
        """One line for the node: each value newly found missing, and on which devices.

        Each (device, value) pair is reported once; values missing on the same
        devices share a clause. What only MIG instances lack (dozens of values,
        by design: NVML answers most of them per GPU) is one clause, a count and
        the commonest few, with the full list at debug level. Runs on the sampler
        thread, for devices whose worker is idle.
        """
        missing: dict[str, list[str]] = {}
        instances: set[str] = set()
        for t in devices:
            if t.device.is_mig:
                instances.add(t.short_label())
            for what in t.newly_unsupported:
                missing.setdefault(what, []).append(t.short_label())
            t.newly_unsupported.clear()
        if not missing:
            return
        on_gpus = {w: labels for w, labels in missing.items() if not instances.issuperset(labels)}
        on_instances = {w: labels for w, labels in missing.items() if w not in on_gpus}
        clauses = _clauses(on_gpus, brief=True)
        if on_instances:
            clauses.append(_instances_clause(on_instances))
            log.debug("not available, omitted from now on (each device): %s",
                      "; ".join(_clauses(missing)))
        log.info("not available, omitted from now on: %s", "; ".join(clauses))

    def _sample_of(self, t: _Tracked, now: float) -> DeviceSample:
        return DeviceSample(
            device=t.device,
            state=t.state,
            values=t.values if t.failure is None else _NO_VALUES,
            xid_counts=MappingProxyType(dict(t.xid)),
            last_xid=t.last_xid,
            xid_events=self._take_xids(t),
            error=t.failure,
            age=max(0.0, now - t.read_at) if t.read_at is not None else 0.0,
            processes=t.processes if t.failure is None else None,
            process_utilization=t.process_utilization and t.failure is None,
        )

    def _hung(
        self, t: _Tracked, worker: DeviceWorker, now: float, problems: list[str]
    ) -> DeviceSample:
        since = worker.job.started if worker.job is not None else now
        what = (f"{t.label()}: reading {worker.current or 'the device'} has not returned "
                f"after {now - since:.1f} s")
        if t.parent is None:
            problems.append(what)
            if t.hung_since is None:
                log.error("%s; its values are omitted until it answers, the other GPUs are "
                          "read as usual", what)
            t.hung_since = since
        return DeviceSample(
            device=t.device,
            state=t.state,
            xid_counts=MappingProxyType(dict(t.xid)),
            last_xid=t.last_xid,
            xid_events=self._take_xids(t),
            error=t.failure,
            hung=what,
            age=now - (t.read_at if t.read_at is not None else since),
        )

    def _answered(self, gpu: _Tracked, now: float) -> None:
        if gpu.hung_since is not None:
            log.warning("%s answered again after %.0f s", gpu.label(), now - gpu.hung_since)
            gpu.hung_since = None

    def _read(self, t: _Tracked, worker: DeviceWorker) -> _Tracked:
        """One device's reads, on its GPU's worker thread; the outcome is left on ``t``."""
        values: dict[str, float] = {}
        newly_unsupported: list[str] = []
        failure = t.parent.failure if t.parent is not None else t.open_failure
        if failure is None:
            retry: set[str] = set()  # fields the batch failed this time: their call stands in
            failure = self._read_fields(t, values, newly_unsupported, worker, retry) or (
                self._read_calls(t, values, newly_unsupported, worker, retry))
        if self._process_usage:
            t.processes, t.process_utilization = None, False
            if failure is None:
                failure = self._read_processes(t, values, newly_unsupported, worker)
        if failure is None:
            self._gpm.read(t, values, newly_unsupported, worker)
        else:
            t.gpm.restart()  # after a failure, a new interval starts
            t.kept.clear()  # and nothing read before it is reused
        t.newly_unsupported.extend(newly_unsupported)  # logged for the node by the sampler
        if failure is not None and t.failure is None:
            log.error("%s failed: %s; its series are dropped and hw.status reports failed",
                      t.label(), failure)
        elif failure is None and t.failure is not None:
            log.warning("%s is readable again", t.label())
        t.failure = failure
        t.state = self._state(failure, values)
        t.values = MappingProxyType(values)
        t.read_at = self._clock()
        worker.current = ""
        return t

    @staticmethod
    def _state(failure: str | None, values: Mapping[str, float]) -> str:
        if failure is not None:
            return FAILED
        if values.get(REMAP_FAILURE.key):
            return PREDICTED_FAILURE
        if values.get(REMAP_PENDING.key) or values.get(RETIRED_PENDING.key):
            return DEGRADED
        return OK

    def _outcome(self, t: _Tracked, what: str, res: Result, unsupported: list[str]) -> str | None:
        """Act on a failed read; returns the failure text when the device failed."""
        if res.outcome is Outcome.DEVICE_FAILED:
            return f"{res.message} ({error_name(res.code, self._m)}) in {what}"
        if t.device.is_mig and res.code in self._gone_codes:
            # The instance was destroyed (a MIG re-layout): rediscover on the next sample.
            if not self._topology_changed:
                log.warning("%s is gone (%s): rediscovering", t.label(),
                            error_name(res.code, self._m))
            self._topology_changed = True
            return None
        if res.outcome is Outcome.UNSUPPORTED:
            t.unsupported.add(what)
            unsupported.append(f"{what} ({error_name(res.code, self._m)})")
        else:
            self._limited.log((t.device.uuid, what), logging.WARNING,
                          "%s: reading %s failed (%s); retrying next sample",
                          t.label(), what, res.message)
        return None

    def _read_calls(
        self, t: _Tracked, values: dict[str, float], unsupported: list[str],
        worker: DeviceWorker, retry: set[str],
    ) -> str | None:
        for reader in self._readers:
            if reader.name in t.unsupported:
                continue
            if reader is COMPUTE_PROCESSES and self._process_usage:
                continue  # _read_processes makes the same call and counts them too
            if reader.fallback_for and not (
                    "fields" in t.unsupported
                    or any(key in t.unsupported or key in t.unbatched or key in retry
                           for key in reader.fallback_for)):
                continue  # what it stands in for is there
            if reader.name in t.static:
                values.update(t.static[reader.name])
                continue
            basis = tuple(values.get(key) for key in reader.changes_with)
            kept = t.kept.get(reader.name)
            if (kept is not None and None not in basis and kept[0] == basis
                    and self._seq - kept[1] < self._rediscover_every):
                values.update(kept[2])  # what it depends on has not moved: nor has it
                continue
            worker.current = reader.name
            res = self._nvml.call(reader.read, self._m, t.handle)
            if res.ok:
                values.update(res.value)
                if reader.static:
                    t.static[reader.name] = dict(res.value)
                elif reader.changes_with:
                    t.kept[reader.name] = (basis, self._seq, dict(res.value))
                continue
            failure = self._outcome(t, reader.name, res, unsupported)
            if failure is not None:
                return failure
        return None

    # --- per-process usage (process_usage on), on the device's worker thread ---------------

    def _read_processes(
        self, t: _Tracked, values: dict[str, float], unsupported: list[str],
        worker: DeviceWorker,
    ) -> str | None:
        """The device's compute processes and their shares, left on ``t``; counts them too.

        A whole GPU in MIG mode lists its instances' processes as well, with their
        instance ids: those are left to the instances, so nothing is counted twice.
        """
        if COMPUTE_PROCESSES.name in t.unsupported:
            return None
        worker.current = "compute processes"
        res = self._nvml.call(self._m.nvmlDeviceGetComputeRunningProcesses, t.handle)
        if not res.ok:
            return self._outcome(t, COMPUTE_PROCESSES.name, res, unsupported)
        values[PROCESSES.key] = len(res.value)
        memory: dict[int, int | None] = {}
        for info in res.value:
            instance = getattr(info, "gpuInstanceId", None)
            if not t.device.is_mig and instance is not None and instance != _NO_INSTANCE:
                continue
            pid, used = int(info.pid), info.usedGpuMemory
            if pid not in memory:
                memory[pid] = None if used is None else int(used)
            elif used is not None:  # listed twice (several contexts): one process
                memory[pid] = (memory[pid] or 0) + int(used)
        shares, failure = self._read_shares(t, unsupported, worker)
        if failure is not None:
            return failure
        idle = (0.0, 0.0, 0.0, 0.0)
        t.process_utilization = shares is not None
        t.processes = tuple(
            ProcessUsage(pid, used, *(shares.get(pid, idle) if shares is not None
                                      else (None, None, None, None)))
            for pid, used in sorted(memory.items())
        )
        return None

    def _read_shares(
        self, t: _Tracked, unsupported: list[str], worker: DeviceWorker,
    ) -> tuple[dict[int, tuple[float, float, float, float]] | None, str | None]:
        """Per pid, (SM, memory controller, encoder, decoder) shares 0..1 since the last read.

        NVML returns a sample per busy process per driver sampling period newer than
        the timestamp passed; each process's samples are averaged, and a process
        without any was idle (0). ``None``: the device gives no per-process utilization.
        """
        m = self._m
        for what in _SHARE_CALLS:
            func = getattr(m, what, None)
            if func is None or what in t.unsupported:
                continue
            worker.current = what
            res = self._nvml.call(func, t.handle, t.utilization_seen)
            if res.code == getattr(m, "NVML_ERROR_NOT_FOUND", None):
                return {}, None  # no process was busy since the last read
            if not res.ok:
                failure = self._outcome(t, what, res, unsupported)
                if failure is not None or what not in t.unsupported:
                    return None, failure
                continue  # this driver lacks it: try the older call
            totals: dict[int, list[float]] = {}
            for row in res.value:
                acc = totals.setdefault(int(row.pid), [0.0, 0.0, 0.0, 0.0, 0.0])
                for i, value in enumerate((row.smUtil, row.memUtil, row.encUtil, row.decUtil)):
                    acc[i] += float(value)
                acc[4] += 1
                t.utilization_seen = max(t.utilization_seen, int(row.timeStamp))
            return {pid: (acc[0] / acc[4] / 100, acc[1] / acc[4] / 100, acc[2] / acc[4] / 100,
                          acc[3] / acc[4] / 100) for pid, acc in totals.items()}, None
        return None, None


_NO_INSTANCE = 0xFFFFFFFF
"""What NVML puts in a process's GPU instance id outside MIG mode."""
_SHARE_CALLS = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")
"""Per-process utilization, newest call first (the first arrived with R550)."""


_SHOWN = 3
"""Values named in the MIG instances' clause of the "not available" line."""


def _clauses(missing: Mapping[str, list[str]], *, brief: bool = False) -> list[str]:
    """``values on devices`` clauses, one per set of devices missing the same values;
    ``brief``: a GPU's MIG instances counted (``GPU 0's 4 MIG instances``), not named."""
    by_devices: dict[tuple[str, ...], list[str]] = {}
    for what, labels in missing.items():
        by_devices.setdefault(tuple(labels), []).append(what)
    clauses = []
    for group, whats in by_devices.items():
        names = _brief(group) if brief else list(group)
        shown = ", ".join(names[:_NAMED]) + (
            f" and {len(names) - _NAMED} more" if len(names) > _NAMED else "")
        where = group[0] if len(group) == 1 else f"{len(group)} devices ({shown})"
        clauses.append(f"{', '.join(whats)} on {where}")
    return clauses


def _brief(labels: tuple[str, ...]) -> list[str]:
    """Labels with each GPU's MIG instances folded into one count, in first-seen order."""
    counts: dict[str, int] = {}  # a label, or "GPU n MIG" for GPU n's instances
    for label in labels:
        gpu, mig, _ = label.partition(" MIG ")
        key = f"{gpu} MIG" if mig else label
        counts[key] = counts.get(key, 0) + 1
    return [f"{key.removesuffix(' MIG')}'s {n} MIG instance{'s' if n > 1 else ''}"
            if key.endswith(" MIG") else key for key, n in counts.items()]


def _instances_clause(missing: Mapping[str, list[str]]) -> str:
    """The MIG instances' part of the line: how many values on how many, the commonest few."""
    count = len({label for labels in missing.values() for label in labels})
    common = sorted(missing, key=lambda what: -len(missing[what]))
    shown = ", ".join(common[:_SHOWN])
    rest = len(common) - _SHOWN
    more = f" and {rest} more (the list at debug level)" if rest > 0 else ""
    noun = "instance" if count == 1 else "instances"
    return f"{len(common)} value(s) on {count} MIG {noun}, most of them answered per GPU " \
           f"only: {shown}{more}"
