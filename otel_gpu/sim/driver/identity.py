"""Which GPU a handle is: lookups by index and UUID, and the identity a GPU reports.

Handles are opaque tokens (see ``_core``); a lookup hands one out after the
same fault checks as any device call, so a lost GPU cannot even be found.
A MIG handle reports its own UUID and name but its parent's PCI location;
serial, VBIOS version (derived from the index), minor number, index and NUMA
node answer only on a whole GPU.
"""

from __future__ import annotations

from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import (
    DriverCore,
    Fail,
    arg_int,
    c_symbol,
    deref,
    gpu_token,
    write_handle,
    write_text,
)


class IdentitySymbols(DriverCore):
    # --- lookups ------------------------------------------------------------------------

    @c_symbol
    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> None:
        sample = self.check_system(None)
        i = arg_int(index)
        if not 0 <= i < len(self.scenario.devices):
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        self._check("nvmlDeviceGetHandleByIndex_v2", self._targets[gpu_token(i)], sample)
        write_handle(out, gpu_token(i))

    @c_symbol(mig=True)
    def nvmlDeviceGetHandleByUUID(self, uuid: Any, out: Any) -> None:
        sample = self.check_system(None)
        raw = getattr(uuid, "value", uuid)
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        token = self._by_uuid.get(text)
        if token is None:
            raise Fail(abi.NVML_ERROR_NOT_FOUND)
        self._check("nvmlDeviceGetHandleByUUID", self._targets[token], sample)
        write_handle(out, token)

    # --- identity -----------------------------------------------------------------------

    @c_symbol(mig=True)
    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, length: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetUUID", handle)
        write_text(buf, length, target.mig.uuid if target.mig else target.gpu.uuid)

    @c_symbol(mig=True)
    def nvmlDeviceGetName(self, handle: Any, buf: Any, length: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetName", handle)
        write_text(buf, length, target.mig.name if target.mig else target.gpu.name)

    @c_symbol
    def nvmlDeviceGetSerial(self, handle: Any, buf: Any, length: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetSerial", handle)
        write_text(buf, length, target.gpu.serial)

    @c_symbol
    def nvmlDeviceGetVbiosVersion(self, handle: Any, buf: Any, length: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetVbiosVersion", handle)
        # One version per GPU, derived from its index: 96.00.30.00.01, 96.00.31.00.01, ...
        write_text(buf, length, f"96.00.{0x30 + target.gpu.index:02X}.00.01")

    @c_symbol(mig=True)
    def nvmlDeviceGetPciInfo_v3(self, handle: Any, info_ref: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetPciInfo_v3", handle)
        info = deref(info_ref)
        bus_id = target.gpu.pci_bus_id
        domain, bus, rest = bus_id.split(":")
        device = rest.split(".")[0]
        info.busId = bus_id.encode()
        info.busIdLegacy = f"{domain[-4:]}:{bus}:{rest}".encode()
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(device, 16)
        info.pciDeviceId = target.gpu.pci_device_id
        info.pciSubSystemId = 0

    @c_symbol
    def nvmlDeviceGetMinorNumber(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetMinorNumber", handle)
        deref(out).value = target.gpu.minor_number

    @c_symbol
    def nvmlDeviceGetIndex(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetIndex", handle)
        deref(out).value = target.gpu.index

    @c_symbol
    def nvmlDeviceGetNumaNodeId(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetNumaNodeId", handle)
        if target.gpu.numa_node is None:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        deref(out).value = target.gpu.numa_node
