"""Memory health beyond the batched fields: the row remapper's bank histogram.

``nvmlDeviceGetRowRemapperHistogram`` answers ``row_remap_histogram``, a
bucket not listed being 0; a GPU without it answers NOT_SUPPORTED, as GPUs
before Ampere do (they retire pages instead: fields RETIRED_SBE, RETIRED_DBE
and RETIRED_PENDING).
"""

from __future__ import annotations

from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import DriverCore, Fail, c_symbol, deref
from otel_gpu.sim.scenario import ROW_REMAP_BUCKETS, Value


class EccSymbols(DriverCore):
    @c_symbol
    def nvmlDeviceGetRowRemapperHistogram(self, handle: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetRowRemapperHistogram", handle)
        histogram = target.gpu.row_remap_histogram
        if not histogram:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        values = deref(out)
        for bucket in ROW_REMAP_BUCKETS:
            value = histogram.get(bucket, Value())
            setattr(values, bucket, self._uint(value, sample, target.gpu.position))
