"""Observation helpers: the catalog rows whose values are not one reading of one NVML value.

A ``per_device`` helper turns one device sample into observations; a
``per_node`` helper the whole snapshot (pods, kubelet, the collector itself).
Each yields ``(value, attributes)`` pairs, the device's own attributes left to
the instruments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from otel_gpu.instrument.attributes import (
    ENERGY_RULE,
    HW_ID,
    HW_STATE,
    K8S_RESOURCE,
    OMITTED_BECAUSE,
    PROCESS_OWNER,
    READER,
    REPLICA,
    UNATTRIBUTED,
    usage_labels,
)
from otel_gpu.instrument.schema import MILLI, Kind, Metric, Observation
from otel_gpu.sample.readers import fabric_cluster_uuid
from otel_gpu.sample.sources import FABRIC_CLIQUE_ID
from otel_gpu.snapshot import STATES, DeviceSample, PodUsage, Snapshot
from otel_gpu.workload import CONTAINER_ATTRIBUTES, POD_ATTRIBUTES, AllocationRow


def status(sample: DeviceSample) -> Iterable[Observation]:
    for state in STATES:
        yield (1.0 if sample.state == state else 0.0), {HW_STATE: state}


def xid(sample: DeviceSample) -> Iterable[Observation]:
    for code, count in sorted(sample.xid_counts.items()):
        yield float(count), {"nvidia.gpu.xid": str(code)}


def device_age(sample: DeviceSample) -> Iterable[Observation]:
    yield sample.age, {}


def unsupported(sample: DeviceSample) -> Iterable[Observation]:
    """Both reasons from the first sample, so that a rise is an increase."""
    yield float(sample.unsupported), {OMITTED_BECAUSE: "unsupported"}
    yield float(sample.not_available), {OMITTED_BECAUSE: "not_available"}


FABRIC_CLIQUE = "nvidia.gpu.fabric.clique_id"
FABRIC_CLUSTER = "nvidia.gpu.fabric.cluster_uuid"
FABRIC_ATTRIBUTES = (FABRIC_CLIQUE, FABRIC_CLUSTER)
"""What ``nvidia.gpu.info`` adds for a GPU in an NVLink domain, once its registration
completed: they are known only then, so they are not the device's discovery attributes."""


def info(sample: DeviceSample) -> Iterable[Observation]:
    values = sample.values
    attrs: dict[str, str] = {}
    clique = values.get(FABRIC_CLIQUE_ID.key)
    if clique is not None:
        attrs[FABRIC_CLIQUE] = str(int(clique))
    cluster = fabric_cluster_uuid(values)
    if cluster is not None:
        attrs[FABRIC_CLUSTER] = cluster
    yield 1.0, attrs


def sample_age(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    yield max(0.0, now - snapshot.taken_monotonic), {}


def sample_duration(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    yield snapshot.duration, {}


def samples(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    yield float(snapshot.seq), {}


def nvml_requests(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    yield float(snapshot.nvml_calls), {}


def reader_failures(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    """Every reader from 0, so that its first failure is an increase."""
    for reader, count in sorted(snapshot.reader_failures.items()):
        yield float(count), {READER: reader}


def devices(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    counts = dict.fromkeys(STATES, 0)
    for sample in snapshot.devices:
        counts[sample.state] += 1
    for state, count in counts.items():
        yield float(count), {HW_STATE: state}


class _AllocationSets:
    """The allocation rows' attribute sets, made once per kubelet answer: the rows are the
    same tuple while the answer (and the devices) stay, so are their sets, and a
    collection at 500 pods looks at none of their contents."""

    def __init__(self) -> None:
        self._last: tuple[tuple[AllocationRow, ...], list[Observation]] = ((), [])

    def __call__(self, snapshot: Snapshot, now: float) -> Iterable[Observation]:
        rows = snapshot.allocations()
        last = self._last  # one read: another thread may replace it meanwhile
        if last[0] is not rows:
            last = self._last = (rows, [(1.0, _allocation_set(row)) for row in rows])
        return last[1]


def _allocation_set(row: AllocationRow) -> dict[str, str]:
    attrs = {HW_ID: row.uuid, **row.ref.attributes(), K8S_RESOURCE: row.resource_name}
    if row.replica is not None:
        attrs[REPLICA] = str(row.replica)
    return attrs


allocations = _AllocationSets()


def allocated(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None:
        return
    for summary in snapshot.pods.attribution.summary():
        yield float(summary.allocated), {K8S_RESOURCE: summary.resource_name}


def allocatable(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None:
        return
    for summary in snapshot.pods.attribution.summary():
        if summary.allocatable is not None:
            yield float(summary.allocatable), {K8S_RESOURCE: summary.resource_name}


def numa_alignment(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None:
        return
    for row in snapshot.pods.attribution.numa_alignment():
        yield row.fraction, {HW_ID: row.uuid, **row.ref.attributes()}


def kubelet_requests(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None or snapshot.pods.kubelet is None:
        return
    for (rpc, code), count in sorted(snapshot.pods.kubelet.requests.items()):
        yield float(count), {"rpc.method": rpc, "rpc.grpc.status_code": code}


def mapping_age(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is not None and snapshot.pods.mapping_taken_monotonic is not None:
        yield max(0.0, now - snapshot.pods.mapping_taken_monotonic), {}


def attributed_pods(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is not None:
        rows = snapshot.allocations()
        yield float(len({(r.namespace, r.pod) for r in rows})), {}


def attributed_devices(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is not None:
        yield float(len(snapshot.pods.attribution.attributed_uuids())), {}


def unresolved_ids(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is not None:
        yield float(len(snapshot.pods.attribution.unresolved)), {}


POD_USAGE = "nvidia.gpu.k8s."
"""The pods' usage names: kept as dashboards know them."""
CONTAINER_USAGE = "nvidia.gpu.container."
"""The usage names of containers outside Kubernetes (docs/containers.md)."""


def pod_usage(snapshot: Snapshot) -> tuple[PodUsage, ...]:
    """The usage rows of the kubelet's pods (and their node's unattributed processes)."""
    return snapshot.pods.usage if snapshot.pods is not None else ()


def container_usage(snapshot: Snapshot) -> tuple[PodUsage, ...]:
    """The rows of containers outside Kubernetes, where no pod's row stands, as
    :meth:`Snapshot.usage` chooses: a node's rows go under one set of names, never both."""
    if pod_usage(snapshot) or snapshot.containers is None:
        return ()
    return snapshot.containers.usage


def usage(field: str, rows: Callable[[Snapshot], Iterable[PodUsage]] = pod_usage,
          ) -> Callable[[Snapshot, float], Iterable[Observation]]:
    def observe(snapshot: Snapshot, now: float) -> Iterable[Observation]:
        for row in rows(snapshot):
            value = getattr(row, field)
            if value is not None:
                yield float(value), usage_labels(row)

    return observe


def usage_metrics(name: str, kind: Kind, unit: str, description: str, field: str,
                  source: str) -> tuple[Metric, Metric]:
    """One usage reading under the pods' name (``nvidia.gpu.k8s.<name>``) and under the
    name of containers outside Kubernetes (``nvidia.gpu.container.<name>``): each family
    carries its own workload's attributes only."""
    unattributed = f"{PROCESS_OWNER}={UNATTRIBUTED}"
    return (
        Metric(
            POD_USAGE + name, kind, unit, f"{description} Per pod container (process usage "
            f"with pod attribution); the processes of no pod are summed under {unattributed}.",
            per_node=usage(field, pod_usage),
            attributes=(HW_ID, *POD_ATTRIBUTES, PROCESS_OWNER),
            source_doc=source,
        ),
        Metric(
            CONTAINER_USAGE + name, kind, unit, f"{description} Per container outside "
            "Kubernetes (process usage, on a node where no kubelet names pods); the processes "
            f"in no container are summed under {unattributed}.",
            per_node=usage(field, container_usage),
            attributes=(HW_ID, *CONTAINER_ATTRIBUTES, PROCESS_OWNER),
            source_doc=source,
        ),
    )


def energy(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None:
        return
    for row in snapshot.pods.energy:
        yield row.millijoules * MILLI.factor, usage_labels(row)


def energy_rules(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None:
        return
    for uuid, rule in dict((row.uuid, row.rule) for row in snapshot.pods.energy).items():
        yield 1.0, {HW_ID: uuid, ENERGY_RULE: rule}
