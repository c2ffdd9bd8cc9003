"""The PCIe link: generation and width, current and maximum, and its sampled throughput.

Each answers its ``pcie`` key for the current sample and the GPU's position
in its ``count`` entry; an absent key answers NOT_SUPPORTED, as on a GPU or
in a VM where the driver does not give it.
"""

from __future__ import annotations

from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import DriverCore, Fail, arg_int, c_symbol, deref


class PcieSymbols(DriverCore):
    def _link(self, symbol: str, key: str, handle: Any, out: Any) -> None:
        target, sample = self.check_device(symbol, handle)
        deref(out).value = self._uint(target.gpu.pcie.get(key), sample, target.gpu.position)

    @c_symbol
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, out: Any) -> None:
        self._link("nvmlDeviceGetCurrPcieLinkGeneration", "generation", handle, out)

    @c_symbol
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, out: Any) -> None:
        self._link("nvmlDeviceGetMaxPcieLinkGeneration", "max_generation", handle, out)

    @c_symbol
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, out: Any) -> None:
        self._link("nvmlDeviceGetCurrPcieLinkWidth", "width", handle, out)

    @c_symbol
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, out: Any) -> None:
        self._link("nvmlDeviceGetMaxPcieLinkWidth", "max_width", handle, out)

    @c_symbol
    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetPcieThroughput", handle)
        key = {abi.NVML_PCIE_UTIL_TX_BYTES: "tx_throughput",
               abi.NVML_PCIE_UTIL_RX_BYTES: "rx_throughput"}.get(arg_int(counter))
        if key is None:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        deref(out).value = self._uint(target.gpu.pcie.get(key), sample, target.gpu.position)
