"""NVLink: the state of each link and its error counters.

A GPU without ``nvlink`` answers NOT_SUPPORTED; a link id past its last link
answers INVALID_ARGUMENT, as the driver does. The per-link data and error
fields are answered by ``nvmlDeviceGetFieldValues`` (:mod:`.fields`).
"""

from __future__ import annotations

from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import DriverCore, Fail, Target, arg_int, c_symbol, deref
from otel_gpu.sim.scenario import NvLinkSpec

_ERROR_COUNTERS = {
    abi.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    abi.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    abi.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    abi.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}


def _link(target: Target, link: Any) -> NvLinkSpec:
    nvlink = target.gpu.nvlink
    if nvlink is None:
        raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
    index = arg_int(link)
    if not 0 <= index < len(nvlink.links):
        raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
    return nvlink.links[index]


class NvLinkSymbols(DriverCore):
    @c_symbol
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetNvLinkState", handle)
        active = _link(target, link).active_at(sample)
        deref(out).value = abi.NVML_FEATURE_ENABLED if active else abi.NVML_FEATURE_DISABLED

    @c_symbol
    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: Any, counter: Any,
                                        out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetNvLinkErrorCounter", handle)
        spec = _link(target, link)
        name = _ERROR_COUNTERS.get(arg_int(counter))
        if name is None:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)  # the ECC lane counters
        deref(out).value = spec.counter(name, sample, target.gpu.position)
