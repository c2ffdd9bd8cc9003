"""The ``kubelet`` naming profile: the accelerator metrics the kubelet exported before 1.20.

Those series existed per container, so they are written for devices a
container holds, with the kubelet's labels and values as cAdvisor read them
(``nvmlDeviceGetMemoryInfo``, version 1): memory used counts the driver's
reserved memory (v2 used + reserved), memory total is the physical total, and
duty cycle is the GPU utilization. cAdvisor's duty cycle was NVML's average
over its last 10 s; otel-gpu's is NVML's utilization over the driver's own
sample period (between 1/6 s and 1 s depending on the product), read each
interval.

cAdvisor also labelled the series ``id`` (the container's cgroup), ``image``
and ``name`` (the runtime's container name). The Pod Resources API tells
neither, so they are left out rather than made up.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_gpu.export.naming import ProfileOptions
from otel_gpu.export.naming.exposition import Family
from otel_gpu.sample import sources as s
from otel_gpu.snapshot import FAILED, Snapshot

DUTY_CYCLE = "container_accelerator_duty_cycle"
MEMORY_USED = "container_accelerator_memory_used_bytes"
MEMORY_TOTAL = "container_accelerator_memory_total_bytes"


def memory_used(values: Mapping[str, float]) -> float | None:
    """What the v1 memory call reports as used: v2 used plus the driver's reservation.

    Drivers before R510 have only the v1 call, whose used already includes it
    (no reserved value is read then).
    """
    used = values.get(s.MEM_USED.key)
    if used is None:
        return None
    return used + values.get(s.MEM_RESERVED.key, 0.0)


class KubeletProfile:
    """Renders a snapshot as the kubelet's container_accelerator_* series."""

    def families(self, snapshot: Snapshot) -> list[Family]:
        duty = Family(DUTY_CYCLE, "gauge",
                      "Percent of time over the past sample period during which the "
                      "accelerator was actively processing.")
        used = Family(MEMORY_USED, "gauge", "Total accelerator memory allocated, in bytes.")
        total = Family(MEMORY_TOTAL, "gauge", "Total accelerator memory, in bytes.")
        for sample in snapshot.devices:
            if sample.state == FAILED:
                continue
            values = sample.values
            in_use = memory_used(values)
            for ref in snapshot.series_pods(sample.device.uuid, per_sharer=True):
                labels = {"container": ref.container, "namespace": ref.namespace, "pod": ref.pod,
                          "make": "nvidia", "model": sample.device.model,
                          "acc_id": sample.device.uuid}
                if s.UTIL_GPU.key in values:
                    duty.add(labels, values[s.UTIL_GPU.key])
                if in_use is not None:
                    used.add(labels, in_use)
                if s.MEM_TOTAL.key in values:
                    total.add(labels, values[s.MEM_TOTAL.key])
        return [duty, used, total]


class _Kubelet:
    name = "kubelet"

    def validate(self, options: ProfileOptions) -> list[str]:
        return []

    def build(self, options: ProfileOptions) -> KubeletProfile:
        return KubeletProfile()


NAMING = _Kubelet()
