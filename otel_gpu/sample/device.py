"""What the sampler keeps about one device across samples, split by who writes it.

A :class:`Tracked` device is its identity (set by discovery, on the sampler
thread) plus one state object per concern, each written by exactly one side:

* :class:`ReadState`, :class:`LinkState`, :class:`ProcessState` and the GPM
  state: by the GPU's worker thread, while that GPU's job runs; the sampler
  thread reads them only once the job is done.
* :class:`XidState` and ``hung_since``: by the sampler thread only.

So no field is written by two threads, and the sampler thread never reads a
worker's state while the worker may be writing it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from otel_gpu.sample.gpm import GpmState
from otel_gpu.sample.sources import REMAP_FAILURE, REMAP_PENDING, RETIRED_PENDING
from otel_gpu.snapshot import (
    DEGRADED,
    FAILED,
    OK,
    PREDICTED_FAILURE,
    Device,
    DeviceSample,
    ProcessUsage,
    XidEvent,
)

NO_VALUES: Mapping[str, float] = MappingProxyType({})


@dataclass
class ReadState:
    """The outcome of the device's reads; worker thread."""

    unsupported: set[str] = field(default_factory=set)
    """Readers and keys the device cannot give: not asked again."""
    failure: str | None = None
    state: str = OK
    values: Mapping[str, float] = field(default_factory=lambda: NO_VALUES)
    read_at: float | None = None
    """Monotonic time the last read of this device finished."""
    static: dict[str, Mapping[str, float]] = field(default_factory=dict)
    """The answers of the static readers, by reader name: read once."""
    kept: dict[str, tuple[tuple[float | None, ...], int, Mapping[str, float]]] = field(
        default_factory=dict)
    """The last answers of the readers with ``changes_with``, by reader name: (the values
    it depends on then, the sample it was read in, the answer)."""
    newly_unsupported: list[str] = field(default_factory=list)
    """Values found unsupported since the sampler last logged them: appended by the worker
    thread, logged and emptied by the sampler thread once the job is done."""
    not_available: set[str] = field(default_factory=set)
    """Keys NVML answered with a "not available" sentinel or an impossible value, already
    noted for this device."""
    newly_impossible: list[str] = field(default_factory=list)
    """Such keys (with the value) since the sampler last logged them, as ``newly_unsupported``."""
    dropped: int = 0
    """Values the latest read dropped as impossible: what ``otel_gpu.nvml.unsupported``
    counts as ``not_available``."""


@dataclass
class LinkState:
    """What the batched field read learned about the device's driver; worker thread."""

    unbatched: set[str] = field(default_factory=set)
    """Fields this device's driver does not answer in the batch: their fallback call gives
    them from then on (decided once, on the first answer)."""
    link_totals: dict[str, bool] = field(default_factory=dict)
    """Per NVLink-links field: whether the driver answers its all-links scope (else: summed)."""
    link_count: int = 0
    """NVLink links the GPU has (answered by the state call per link)."""
    active_links: tuple[int, ...] = ()
    """The NVLink links active at the last read: what the NVLink fields are asked for."""
    states_batched: bool | None = None
    """Whether the batch gives the link states as the calls per link do (None: not yet
    compared)."""


@dataclass
class ProcessState:
    """The last read's compute processes (process usage on); worker thread."""

    processes: tuple[ProcessUsage, ...] | None = None
    utilization: bool = False
    """Whether the processes' shares were read."""
    seen: int = 0
    """NVML timestamp (us) of the newest per-process utilization sample read so far."""


@dataclass
class XidState:
    """XID events of a GPU; sampler thread."""

    counts: Counter[int] = field(default_factory=Counter)
    last: int | None = None
    pending: list[XidEvent] = field(default_factory=list)
    """XID events read since this device's last sample; handed on and emptied by it."""
    registered: bool = False
    unavailable: bool = False

    def take(self) -> tuple[XidEvent, ...]:
        """The events read since the last sample, handed on once."""
        events, self.pending = tuple(self.pending), []
        return events


@dataclass(eq=False)
class Tracked:
    """One GPU or MIG instance across samples: identity, and its state by concern."""

    device: Device
    handle: Any
    parent: Tracked | None = None
    open_failure: str | None = None
    """Why NVML could not open the GPU at the last discovery (then ``handle`` is stale)."""
    reads: ReadState = field(default_factory=ReadState)
    links: LinkState = field(default_factory=LinkState)
    procs: ProcessState = field(default_factory=ProcessState)
    gpm: GpmState = field(default_factory=GpmState)
    xid: XidState = field(default_factory=XidState)
    mig_note: str | None = None
    """Sampler thread: why a GPU in MIG mode shows no MIG instance, from its discovery."""
    hung_since: float | None = None
    """Sampler thread: when the GPU's pending call started, while it hangs."""

    @property
    def unsupported(self) -> set[str]:
        return self.reads.unsupported

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

    def sample(self, now: float) -> DeviceSample:
        """What the device's last read gave, for a snapshot finished at ``now``."""
        r, failed = self.reads, self.reads.failure is not None
        return DeviceSample(
            device=self.device,
            state=r.state,
            values=NO_VALUES if failed else r.values,
            xid_counts=MappingProxyType(dict(self.xid.counts)),
            last_xid=self.xid.last,
            xid_events=self.xid.take(),
            error=r.failure,
            age=max(0.0, now - r.read_at) if r.read_at is not None else 0.0,
            processes=None if failed else self.procs.processes,
            process_utilization=self.procs.utilization and not failed,
            unsupported=len(r.unsupported),
            not_available=0 if failed else r.dropped,
        )

    def hung_sample(self, what: str | None, since: float, now: float) -> DeviceSample:
        """The device while a call on its GPU has not returned (``what`` it is), or after its
        read raised (``what`` None): no values, its last state."""
        read_at = self.reads.read_at
        return DeviceSample(
            device=self.device,
            state=self.reads.state,
            xid_counts=MappingProxyType(dict(self.xid.counts)),
            last_xid=self.xid.last,
            xid_events=self.xid.take(),
            error=self.reads.failure,
            hung=what,
            age=now - (read_at if read_at is not None else since),
            unsupported=len(self.reads.unsupported),
        )


def state_of(failure: str | None, values: Mapping[str, float]) -> str:
    """The ``hw.state`` a read gives: failed, or what the memory's repair counters say."""
    if failure is not None:
        return FAILED
    if values.get(REMAP_FAILURE.key):
        return PREDICTED_FAILURE
    if values.get(REMAP_PENDING.key) or values.get(RETIRED_PENDING.key):
        return DEGRADED
    return OK
