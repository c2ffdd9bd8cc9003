"""NVLink: the state of each link and its error counters.

A GPU without ``nvlink`` answers NOT_SUPPORTED; a link id past its last link
answers INVALID_ARGUMENT, as the driver does. The per-link data and error
fields are answered by ``nvmlDeviceGetFieldValues`` (:mod:`.fields`).
"""

from __future__ import annotations

from typing import Any

import pynvml

from otel_gpu.sim.driver._core import DriverCore, Fail, Target, arg_int, c_symbol, deref
from otel_gpu.sim.scenario import NvLinkSpec

_ERROR_COUNTERS = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}


def _link(target: Target, link: Any) -> NvLinkSpec:
    nvlink = target.gpu.nvlink
    if nvlink is None:
        raise Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    index = arg_int(link)
    if not 0 <= index < len(nvlink.links):
        raise Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return nvlink.links[index]


class NvLinkSymbols(DriverCore):
    @c_symbol
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetNvLinkState", handle)
        active = _link(target, link).active_at(sample)
        deref(out).value = pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED

    @c_symbol
    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: Any, counter: Any,
                                        out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetNvLinkErrorCounter", handle)
        spec = _link(target, link)
        name = _ERROR_COUNTERS.get(arg_int(counter))
        if name is None:
            raise Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # the ECC lane counters
        deref(out).value = spec.counter(name, sample, target.gpu.position)
