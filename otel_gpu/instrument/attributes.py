"""Attribute names, and the attributes of a device and of its workload.

The ``hw.*`` names are OpenTelemetry's hardware semantic conventions; the
others are ours (``nvidia.gpu.*``). The workload's (``k8s.*``, ``container.*``, the
HPC job) are :mod:`otel_gpu.workload`'s. :func:`device_attributes` is the one place a
device's attributes are made: the instruments' series and the GPU event records both
take them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from otel_gpu.snapshot import Device, PodEnergy, PodUsage, Snapshot
from otel_gpu.workload import (
    CONTAINER_ATTRIBUTES,
    CONTAINER_ID,
    CONTAINER_IMAGE_NAME,
    CONTAINER_NAME,
    HPC_JOB_ID,
    K8S_CONTAINER_NAME,
    K8S_NAMESPACE_NAME,
    K8S_POD_NAME,
    K8S_POD_UID,
    POD_ATTRIBUTES,
)

HW_ID = "hw.id"
HW_NAME = "hw.name"
HW_VENDOR = "hw.vendor"
HW_MODEL = "hw.model"
HW_PARENT = "hw.parent"
HW_TYPE = "hw.type"
HW_DRIVER_VERSION = "hw.driver_version"
HW_SERIAL = "hw.serial_number"
HW_STATE = "hw.state"
OMITTED_BECAUSE = "otel_gpu.nvml.reason"
READER = "otel_gpu.reader"
GPU_INDEX = "nvidia.gpu.index"
PCI_BUS_ID = "nvidia.gpu.pci_bus_id"
MIG_PROFILE = "nvidia.gpu.mig.profile"
MIG_GI = "nvidia.gpu.mig.gpu_instance_id"
MIG_CI = "nvidia.gpu.mig.compute_instance_id"
NUMA_NODE = "nvidia.gpu.numa_node"
K8S_RESOURCE = "nvidia.gpu.k8s.resource"
REPLICA = "nvidia.gpu.k8s.replica"

IDENTITY_ATTRIBUTES: frozenset[str] = frozenset(
    {HW_ID, HW_TYPE, GPU_INDEX, HW_PARENT, MIG_PROFILE, MIG_GI, MIG_CI})
"""The device attributes every series of a device carries (with its pods and jobs): what
tells one device from another. The others describe the device and never change while it is
there; with ``device_attributes: identity`` (the default) only ``nvidia.gpu.info`` carries
them, so that each series costs a collection fewer attributes to clean and hash."""

DEVICE_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    (HW_ID, "GPU UUID (`GPU-...`) or MIG instance UUID (`MIG-...`)"),
    (HW_TYPE, "always `gpu`"),
    (HW_VENDOR, "always `NVIDIA`"),
    (HW_MODEL, "product name of the physical GPU, e.g. `NVIDIA H100 80GB HBM3`"),
    (HW_NAME, "NVML name of this device; a MIG instance's names its profile"),
    (HW_PARENT, "MIG instances only: the UUID of the GPU they are carved from"),
    (HW_DRIVER_VERSION, "NVIDIA driver version"),
    (HW_SERIAL, "board serial number, when NVML reports one (GPUs only)"),
    (GPU_INDEX, "NVML index of the GPU (of the parent GPU for a MIG instance)"),
    (PCI_BUS_ID, "PCI bus id as NVML writes it, e.g. `00000000:18:00.0` (else sysfs'; "
                 "absent when neither gives one)"),
    (MIG_PROFILE, "MIG instances only: profile, e.g. `1g.10gb`"),
    (MIG_GI, "MIG instances only: GPU instance id"),
    (MIG_CI, "MIG instances only: compute instance id"),
    (NUMA_NODE, "NUMA node of the GPU (kubelet topology, else NVML, else sysfs), when known"),
    (K8S_POD_NAME, "pod holding the device whole (Kubernetes attribution on; absent on shared "
              "or free devices)"),
    (K8S_NAMESPACE_NAME, "namespace of that pod"),
    (K8S_CONTAINER_NAME, "container of that pod holding the device"),
    (K8S_POD_UID, "UID of that pod, where the node's files say it (the kubelet's pod log "
                  "directories, `pod_log_root`)"),
    (HPC_JOB_ID, "HPC (Slurm) jobs using the device, comma-separated, from the job mapping "
              "directory and the processes' cgroups (`hpc_job_mapping_dir`, `process_usage`)"),
    (CONTAINER_ID, "container outside Kubernetes whose processes alone use the device, from "
                   "their cgroups (`process_usage`; docs/containers.md)"),
    (CONTAINER_NAME, "that container's name, from the runtime's API (`container_socket`)"),
    (CONTAINER_IMAGE_NAME, "that container's image, without its tag"),
)
# Per-pod usage (process_usage): one series per (device, container), and one per device
# for the processes of no pod, marked by PROCESS_OWNER instead of pod attributes.
PROCESS_OWNER = "nvidia.gpu.process.owner"
UNATTRIBUTED = "unattributed"
USAGE_ATTRIBUTES = (HW_ID, *POD_ATTRIBUTES, *CONTAINER_ATTRIBUTES, PROCESS_OWNER)
ENERGY_RULE = "nvidia.gpu.energy.rule"

DeviceAttributes = Literal["identity", "all"]
"""The ``device_attributes`` setting: which device attributes every series carries."""
IDENTITY: DeviceAttributes = "identity"
"""Only what identifies the device
(:data:`IDENTITY_ATTRIBUTES`) and its pods and jobs; the
descriptive attributes are on ``nvidia.gpu.info`` alone."""
ALL: DeviceAttributes = "all"
"""Every device attribute on every series (the default: what the hardware semantic
conventions recommend, and what a backend without joins can group by)."""


def usage_labels(row: PodUsage | PodEnergy) -> dict[str, str]:
    """A usage row's attributes: the device and the container, or the unattributed mark."""
    if row.pod is None:
        return {HW_ID: row.uuid, PROCESS_OWNER: UNATTRIBUTED}
    return {HW_ID: row.uuid, **row.pod.attributes()}


def kubelet_numa_node(snapshot: Snapshot, device: Device) -> int | None:
    """The device's NUMA node as the kubelet's topology gives it, which beats NVML's and
    sysfs' (None when the kubelet does not say)."""
    if snapshot.pods is None:
        return None
    return snapshot.pods.attribution.numa_node(device.uuid)


def identity_attributes(attrs: Mapping[str, str | int]) -> dict[str, str | int]:
    """The part of a device's attributes that tells it from the others."""
    return {key: value for key, value in attrs.items() if key in IDENTITY_ATTRIBUTES}


def device_attributes(
    device: Device, driver_version: str | None, numa_node: int | None = None
) -> dict[str, str | int]:
    """Every attribute of one device: what ``nvidia.gpu.info`` carries, what every
    series carries with ``device_attributes: all``, and what every GPU event names.

    ``numa_node``: the kubelet's word for it (:func:`kubelet_numa_node`), which beats
    what discovery found.
    """
    attrs: dict[str, str | int] = {
        HW_ID: device.uuid,
        HW_TYPE: "gpu",
        HW_VENDOR: "NVIDIA",
        HW_MODEL: device.model,
        HW_NAME: device.name,
        GPU_INDEX: device.index,
    }
    if device.pci_bus_id:  # "" when neither NVML nor sysfs gave one: absent, not empty
        attrs[PCI_BUS_ID] = device.pci_bus_id
    if driver_version:
        attrs[HW_DRIVER_VERSION] = driver_version
    numa = numa_node if numa_node is not None else device.numa_node
    if numa is not None:
        attrs[NUMA_NODE] = numa
    if device.serial:
        attrs[HW_SERIAL] = device.serial
    if device.is_mig:
        if device.parent_uuid:  # the parent's hw.id, as the hardware conventions ask
            attrs[HW_PARENT] = device.parent_uuid
        if device.mig_profile:
            attrs[MIG_PROFILE] = device.mig_profile
        if device.gpu_instance_id is not None:
            attrs[MIG_GI] = device.gpu_instance_id
        if device.compute_instance_id is not None:
            attrs[MIG_CI] = device.compute_instance_id
    return attrs

