"""One device in one snapshot, as an event record names it: its label, its attributes and
the pods holding it."""

from __future__ import annotations

from otel_gpu.export.events.records import HOLDERS
from otel_gpu.instrument.attributes import device_attributes, kubelet_numa_node
from otel_gpu.snapshot import DeviceSample, Snapshot


class DeviceContext:
    """One device in one snapshot: its attributes and the pods holding it."""

    def __init__(self, snapshot: Snapshot, sample: DeviceSample, limit: int) -> None:
        self.snapshot = snapshot
        self.sample = sample
        self._limit = limit

    def label(self) -> str:
        d = self.sample.device
        if d.is_mig:
            return f"GPU {d.index} MIG {d.mig_profile} ({d.uuid})"
        return f"GPU {d.index} ({d.uuid})"

    def mig_instance(self, gi: int | None, ci: int | None) -> DeviceSample | None:
        """The MIG instance of this GPU an XID names, when NVML named one that is known."""
        if gi is None:
            return None
        for s in self.snapshot.devices:
            d = s.device
            if (d.parent_uuid == self.sample.device.uuid and d.gpu_instance_id == gi
                    and (ci is None or d.compute_instance_id == ci)):
                return s
        return None

    def attributes(self, target: DeviceSample | None = None) -> dict[str, object]:
        """The device's attributes and its workload's, both the instruments' own
        (:func:`device_attributes`, :meth:`~otel_gpu.snapshot.Snapshot.workload_attributes`),
        so that the OTLP exporter puts a record under the Resource of its device's metrics;
        without a pod holding the device whole, every holder's name in one attribute."""
        device = (target or self.sample).device
        attrs: dict[str, object] = dict(device_attributes(
            device, self.snapshot.driver_version, kubelet_numa_node(self.snapshot, device)))
        attrs.update(self.snapshot.workload_attributes(device.uuid))
        if self.snapshot.series_pods(device.uuid):
            return attrs
        holders = self._holders(device.uuid)
        if holders:
            attrs[HOLDERS] = holders
        return attrs

    def _holders(self, uuid: str) -> tuple[str, ...]:
        """``namespace/pod/container`` of each container holding the device or, for a GPU
        in MIG mode, one of its instances; sorted, at most the limit."""
        pods = self.snapshot.pods
        if pods is None:
            return ()
        uuids = [uuid] + [s.device.uuid for s in self.snapshot.devices
                          if s.device.parent_uuid == uuid]
        names = sorted({f"{h.namespace}/{h.pod}/{h.container}"
                        for u in uuids for h in pods.attribution.holders(u)})
        return tuple(names[:self._limit])
