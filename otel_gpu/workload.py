"""Workload identities: what a device's series, usage rows and OTLP Resource are attributed to.

One identity per workload, made once where its source answers (the kubelet's
List, a process's cgroup, the container runtime's list, a job mapping file)
and carried as it is to every output: each says its own attributes under the
OpenTelemetry semantic conventions, so the instruments, the events and the
OTLP Resources read one shape whatever the workload is. Each attribute name
is defined here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

K8S_POD_NAME = "k8s.pod.name"
K8S_POD_UID = "k8s.pod.uid"
K8S_NAMESPACE_NAME = "k8s.namespace.name"
K8S_CONTAINER_NAME = "k8s.container.name"
CONTAINER_ID = "container.id"
CONTAINER_NAME = "container.name"
CONTAINER_IMAGE_NAME = "container.image.name"
HPC_JOB_ID = "nvidia.gpu.hpc.job.id"
"""HPC (Slurm) job ids using the device, comma-separated; OpenTelemetry has no convention
for a batch job yet (see docs/hpc.md)."""

POD_ATTRIBUTES = (K8S_POD_NAME, K8S_NAMESPACE_NAME, K8S_CONTAINER_NAME, K8S_POD_UID)
CONTAINER_ATTRIBUTES = (CONTAINER_ID, CONTAINER_NAME, CONTAINER_IMAGE_NAME)
WORKLOAD_ATTRIBUTES: tuple[str, ...] = (*POD_ATTRIBUTES, HPC_JOB_ID, *CONTAINER_ATTRIBUTES)
"""The pod, HPC job and container attributes: on every series of a device, never on its
info series; with OTLP, they move from the point to the workload's Resource (in this
order, which orders the Resources)."""


@dataclass(frozen=True)
class PodRef:
    """A Kubernetes container, as series labels name it.

    ``container`` is empty when the pod is known but not which of its
    containers. ``uid`` is the pod's UID where the node says it (a process's
    cgroup, the kubelet's pod log directory; the Pod Resources API never
    does): it is an attribute, not part of the identity, so a container seen
    by the kubelet (no UID) and through its processes (UID) is one container.
    """

    pod: str
    namespace: str
    container: str
    uid: str | None = field(default=None, compare=False)

    def attributes(self) -> dict[str, str]:
        attrs = {K8S_POD_NAME: self.pod, K8S_NAMESPACE_NAME: self.namespace}
        if self.container:
            attrs[K8S_CONTAINER_NAME] = self.container
        if self.uid:
            attrs[K8S_POD_UID] = self.uid
        return attrs

    @property
    def sort_key(self) -> tuple[str, ...]:
        return ("pod", self.namespace, self.pod, self.container)

    def with_container(self, container: str) -> PodRef:
        return PodRef(self.pod, self.namespace, container, self.uid)

    def with_uid(self, uid: str | None) -> PodRef:
        return self if uid is None or uid == self.uid else PodRef(
            self.pod, self.namespace, self.container, uid)


@dataclass(frozen=True)
class ContainerRef:
    """A container outside Kubernetes (Docker, Podman, containerd, CRI-O), by its id.

    ``name`` and ``image`` come from the runtime's API where its socket is
    mounted; ``None`` where it did not say.
    """

    id: str
    """64 hex digits, as the runtime and the cgroup path spell it."""
    name: str | None = None
    image: str | None = None
    """The image's name without its tag or digest (``container.image.name``)."""

    def attributes(self) -> dict[str, str]:
        attrs = {CONTAINER_ID: self.id}
        if self.name:
            attrs[CONTAINER_NAME] = self.name
        if self.image:
            attrs[CONTAINER_IMAGE_NAME] = self.image
        return attrs

    @property
    def sort_key(self) -> tuple[str, ...]:
        return ("container", self.name or "", self.id)


@dataclass(frozen=True)
class JobRef:
    """An HPC (Slurm) job using a device."""

    job_id: str

    def attributes(self) -> dict[str, str]:
        return {HPC_JOB_ID: self.job_id}

    @property
    def sort_key(self) -> tuple[str, ...]:
        return ("job", self.job_id)


Workload = PodRef | ContainerRef | JobRef
"""Whatever a device's series, usage rows and OTLP Resource can be attributed to."""
Owner = PodRef | ContainerRef
"""What a process runs in: the workloads usage and energy rows are kept per."""


def workload_attributes(workloads: Iterable[Workload]) -> dict[str, str]:
    """The attributes of a device's workloads on one series: the jobs comma-separated
    (one series, however many jobs share the device), the others' as they are."""
    attrs: dict[str, str] = {}
    jobs: list[str] = []
    for workload in workloads:
        if isinstance(workload, JobRef):
            jobs.append(workload.job_id)
        else:
            attrs.update(workload.attributes())
    if jobs:
        attrs[HPC_JOB_ID] = ",".join(jobs)
    return attrs


# --- a Kubernetes container holding a device (the kubelet's answer, joined) ---------


class HeldByPod:
    """A row about one container of a pod (its ``ref``): the names read from the ref."""

    ref: PodRef

    @property
    def pod(self) -> str:
        return self.ref.pod

    @property
    def namespace(self) -> str:
        return self.ref.namespace

    @property
    def container(self) -> str:
        return self.ref.container


@dataclass(frozen=True)
class Holder(HeldByPod):
    """A container holding a device. ``replica`` is the share number, if shared."""

    ref: PodRef
    replica: int | None
    resource_name: str
    shared: bool = False
    """Held through a shared id (replica, GKE vgpu, DRA share): never an owner."""


@dataclass(frozen=True)
class AllocationRow(HeldByPod):
    """One row of the allocation metric (value 1)."""

    uuid: str
    ref: PodRef
    replica: int | None
    resource_name: str


@dataclass(frozen=True)
class NumaAlignment(HeldByPod):
    """Share of a container's exclusive CPUs on the NUMA node(s) of its device."""

    ref: PodRef
    uuid: str
    numa_nodes: tuple[int, ...]
    fraction: float
