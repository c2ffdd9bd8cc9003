"""The ``kubelet`` naming profile: the accelerator metrics the kubelet exported before 1.20.

Those series existed per container, so they are written for devices a
container holds, with the kubelet's labels and the documented mapping:
duty cycle = GPU utilization, memory used = framebuffer used, memory total =
framebuffer used + free.
"""

from __future__ import annotations

from otel_gpu.naming.exposition import Family
from otel_gpu.nvml import sources as s
from otel_gpu.snapshot import FAILED, Snapshot

DUTY_CYCLE = "container_accelerator_duty_cycle"
MEMORY_USED = "container_accelerator_memory_used_bytes"
MEMORY_TOTAL = "container_accelerator_memory_total_bytes"


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
            for ref in snapshot.series_pods(sample.device.uuid, per_sharer=True):
                labels = {"container": ref.container, "namespace": ref.namespace, "pod": ref.pod,
                          "make": "nvidia", "model": sample.device.model,
                          "acc_id": sample.device.uuid}
                if s.UTIL_GPU.key in values:
                    duty.add(labels, values[s.UTIL_GPU.key])
                if s.MEM_USED.key in values:
                    used.add(labels, values[s.MEM_USED.key])
                    if s.MEM_FREE.key in values:
                        total.add(labels, values[s.MEM_USED.key] + values[s.MEM_FREE.key])
        return [duty, used, total]
