"""The ``kubelet`` naming profile: the accelerator metrics the kubelet exported before 1.20.

Those series existed per container, so they are written for devices a
container holds, with the kubelet's labels and the documented mapping:
duty cycle = GPU utilization, memory used = framebuffer used, memory total =
framebuffer used + free.
"""

from __future__ import annotations

from otel_gpu import catalog as c
from otel_gpu.naming.exposition import Family
from otel_gpu.snapshot import FAILED, Snapshot

DUTY_CYCLE = "container_accelerator_duty_cycle"
MEMORY_USED = "container_accelerator_memory_used_bytes"
MEMORY_TOTAL = "container_accelerator_memory_total_bytes"


class KubeletView:
    """Renders a snapshot as the kubelet's container_accelerator_* series."""

    def families(self, snapshot: Snapshot) -> list[Family]:
        duty = Family(DUTY_CYCLE, "gauge",
                      "Percent of time over the past sample period during which the "
                      "accelerator was actively processing.")
        used = Family(MEMORY_USED, "gauge", "Total accelerator memory allocated, in bytes.")
        total = Family(MEMORY_TOTAL, "gauge", "Total accelerator memory, in bytes.")
        if snapshot.pods is None:
            return [duty, used, total]
        attribution = snapshot.pods.attribution
        for sample in snapshot.devices:
            holders = attribution.holders(sample.device.uuid)
            if sample.state == FAILED or not holders:
                continue
            values = sample.values
            seen: set[tuple[str, str, str]] = set()
            for h in holders:
                if (h.namespace, h.pod, h.container) in seen:
                    continue
                seen.add((h.namespace, h.pod, h.container))
                labels = {"container": h.container, "namespace": h.namespace, "pod": h.pod,
                          "make": "nvidia", "model": sample.device.model,
                          "acc_id": sample.device.uuid}
                if c.UTIL_GPU.key in values:
                    duty.add(labels, values[c.UTIL_GPU.key])
                if c.MEM_USED.key in values:
                    used.add(labels, values[c.MEM_USED.key])
                    if c.MEM_FREE.key in values:
                        total.add(labels, values[c.MEM_USED.key] + values[c.MEM_FREE.key])
        return [duty, used, total]
