"""``nvmlDeviceGetFieldValues``: many readings in one call, each entry with its own result.

The call itself succeeds while single entries fail: a field the scenario does
not list is NOT_SUPPORTED, and ``unsupported`` / ``no_permission`` /
``errors`` naming a field fail that entry only. On a MIG handle every entry
is NOT_SUPPORTED. Timestamps advance ten seconds per sample. The NVLink fields
of a GPU with ``nvlink`` come from its links (:func:`_nvlink`), the only
entries whose scope id matters.
"""

from __future__ import annotations

from typing import Any

import pynvml

from otel_gpu.sim.driver._core import DriverCore, arg_int, c_symbol, deref
from otel_gpu.sim.scenario import NVLINK_FIELDS, U64_MAX, GpuSpec, Value

_ALL_LINKS = 0xFFFFFFFF
_PER_LINK = frozenset({pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                       pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX})


def _nvlink(gpu: GpuSpec, field_id: int, scope: int, sample: int) -> tuple[int, Value | None]:
    """An NVLink field of a GPU with ``nvlink``: (return code, value).

    The data counters' scope is a link id, UINT_MAX asking for every link's sum
    (``INVALID_ARGUMENT`` without ``all_links_scope``, or past the last link);
    the error totals sum every link whatever the scope.
    """
    nvlink, name, k = gpu.nvlink, NVLINK_FIELDS[field_id], gpu.position
    assert nvlink is not None
    if field_id in _PER_LINK and scope != _ALL_LINKS:
        if scope >= len(nvlink.links):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, None
        return pynvml.NVML_SUCCESS, Value(nvlink.links[scope].counter(name, sample, k))
    if field_id in _PER_LINK and not nvlink.all_links_scope:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT, None
    return pynvml.NVML_SUCCESS, Value(nvlink.total(name, sample, k))

_TIMESTAMP_BASE_US = 1_700_000_000_000_000
_SAMPLE_PERIOD_US = 10_000_000


class FieldSymbols(DriverCore):
    @c_symbol
    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetFieldValues", handle)
        values = deref(values_ref)
        k = target.gpu.position
        fields = target.gpu.fields if target.mig is None else {}
        field_faults = target.gpu.faults.fields if target.mig is None else {}
        timestamp = _TIMESTAMP_BASE_US + sample * _SAMPLE_PERIOD_US
        for i in range(arg_int(count)):
            entry = values[i]
            entry.timestamp = timestamp
            entry.latencyUsec = 0
            entry.value.ullVal = 0
            code = field_faults.get(entry.fieldId)
            spec = fields.get(entry.fieldId)
            if (code is None and target.mig is None and target.gpu.nvlink is not None
                    and entry.fieldId in NVLINK_FIELDS):
                code, spec = _nvlink(target.gpu, entry.fieldId, entry.scopeId, sample)
            if code is None and spec is None:
                code = pynvml.NVML_ERROR_NOT_SUPPORTED
            if code:
                entry.nvmlReturn = code
                continue
            value = spec.at(sample, k)
            entry.nvmlReturn = pynvml.NVML_SUCCESS
            if isinstance(value, int) and value >= 0:
                entry.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                entry.value.ullVal = min(value, U64_MAX)
            elif isinstance(value, int):
                entry.valueType = pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG
                entry.value.sllVal = max(value, -(2**63))
            else:
                entry.valueType = pynvml.NVML_VALUE_TYPE_DOUBLE
                entry.value.dVal = float(value)
