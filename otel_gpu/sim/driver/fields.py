"""``nvmlDeviceGetFieldValues``: many readings in one call, each entry with its own result.

The call itself succeeds while single entries fail: a field the scenario does
not list is NOT_SUPPORTED, and ``unsupported`` / ``no_permission`` /
``errors`` naming a field fail that entry only. On a MIG handle every entry
is NOT_SUPPORTED. Timestamps advance ten seconds per sample. The NVLink fields
of a GPU with ``nvlink`` come from its links (:func:`_nvlink`), the only
entries whose scope id matters.

The fields that give what a plain call gives (:data:`PLAIN`: the 1 s average
power, the power limits, the perf-policy violation times) answer from the same
scenario data as that call, in the same unit and clamped to its C type, and
share its faults: ``unsupported`` / ``no_permission`` / ``errors`` naming the
call fail the entry, and its ``slow`` delays the field call. So a collector
reading either gets the same values. Listing such a field in ``fields``
overrides it; naming the field in the faults fails the entry alone, as on a
driver older than the field id. NVLINK_GET_STATE answers, at a link's scope,
what ``nvmlDeviceGetNvLinkState`` answers for it (``NVML_NVLINK_STATE_ACTIVE``
for an active link), faults and ``slow`` included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import DriverCore, arg_int, c_symbol, deref
from otel_gpu.sim.scenario import (
    NOT_AVAILABLE,
    NVLINK_FIELDS,
    U32_MAX,
    U64_MAX,
    VIOLATION_POLICIES,
    GpuSpec,
    Value,
    clamp,
)

_ALL_LINKS = 0xFFFFFFFF
_PER_LINK = frozenset({abi.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                       abi.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX})


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
            return abi.NVML_ERROR_INVALID_ARGUMENT, None
        return abi.NVML_SUCCESS, Value(nvlink.links[scope].counter(name, sample, k))
    if field_id in _PER_LINK and not nvlink.all_links_scope:
        return abi.NVML_ERROR_INVALID_ARGUMENT, None
    return abi.NVML_SUCCESS, Value(nvlink.total(name, sample, k))

def _limit(key: str) -> Callable[[GpuSpec], Value | None]:
    return lambda gpu: gpu.power_limits.get(key)


def _range(key: str) -> Callable[[GpuSpec], Value | None]:
    # nvmlDeviceGetPowerManagementLimitConstraints answers only with both ends.
    return lambda gpu: (gpu.power_limits.get(key)
                        if "min" in gpu.power_limits and "max" in gpu.power_limits else None)


def _violation(policy: str) -> Callable[[GpuSpec], Value | None]:
    return lambda gpu: gpu.violations.get(policy)


PLAIN: dict[int, tuple[str, Callable[[GpuSpec], Value | None], int]] = {
    abi.NVML_FI_DEV_POWER_AVERAGE: ("nvmlDeviceGetPowerUsage", lambda gpu: gpu.power,
                                       U32_MAX),
    abi.NVML_FI_DEV_POWER_REQUESTED_LIMIT: ("nvmlDeviceGetPowerManagementLimit",
                                               _limit("current"), U32_MAX),
    abi.NVML_FI_DEV_POWER_CURRENT_LIMIT: ("nvmlDeviceGetEnforcedPowerLimit",
                                             _limit("enforced"), U32_MAX),
    abi.NVML_FI_DEV_POWER_DEFAULT_LIMIT: ("nvmlDeviceGetPowerManagementDefaultLimit",
                                             _limit("default"), U32_MAX),
    abi.NVML_FI_DEV_POWER_MIN_LIMIT: ("nvmlDeviceGetPowerManagementLimitConstraints",
                                         _range("min"), U32_MAX),
    abi.NVML_FI_DEV_POWER_MAX_LIMIT: ("nvmlDeviceGetPowerManagementLimitConstraints",
                                         _range("max"), U32_MAX),
    **{getattr(abi, f"NVML_FI_DEV_PERF_POLICY_{policy.upper()}"): (
        "nvmlDeviceGetViolationStatus", _violation(policy), U64_MAX)
       for policy in VIOLATION_POLICIES},
}
"""Field id -> (the plain call giving the same value, its scenario value, its C maximum)."""

_LINK_STATE = abi.NVML_FI_DEV_NVLINK_GET_STATE
_LINK_STATE_CALL = "nvmlDeviceGetNvLinkState"


def _standing_for(field_id: int) -> str | None:
    """The plain call a field answers for, if any."""
    if field_id in PLAIN:
        return PLAIN[field_id][0]
    return _LINK_STATE_CALL if field_id == _LINK_STATE else None


_TIMESTAMP_BASE_US = 1_700_000_000_000_000
_SAMPLE_PERIOD_US = 10_000_000


class FieldSymbols(DriverCore):
    @c_symbol(mig=True)
    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetFieldValues", handle)
        values = deref(values_ref)
        k = target.gpu.position
        fields = target.gpu.fields if target.mig is None else {}
        field_faults = target.gpu.faults.fields if target.mig is None else {}
        timestamp = _TIMESTAMP_BASE_US + sample * _SAMPLE_PERIOD_US
        if target.mig is None:  # the plain calls' slowness, once per call standing behind
            self.delay({_standing_for(values[i].fieldId) or "" for i in range(arg_int(count))
                        if values[i].fieldId not in fields
                        and values[i].fieldId not in field_faults}, target.gpu, sample)
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
            if code is None and spec is None and target.mig is None and entry.fieldId in PLAIN:
                code = self._plain(entry, target.gpu, sample)
                if code is None:
                    continue
            if (code is None and spec is None and target.mig is None
                    and entry.fieldId == _LINK_STATE):
                code = self._link_state(entry, target.gpu, sample)
                if code is None:
                    continue
            if code is None and spec is None:
                code = abi.NVML_ERROR_NOT_SUPPORTED
            if code == NOT_AVAILABLE:
                self._not_available(entry)
                continue
            if code or spec is None:
                entry.nvmlReturn = code or abi.NVML_ERROR_NOT_SUPPORTED
                continue
            value = spec.at(sample, k)
            entry.nvmlReturn = abi.NVML_SUCCESS
            if isinstance(value, int) and value >= 0:
                entry.valueType = abi.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                entry.value.ullVal = min(value, U64_MAX)
            elif isinstance(value, int):
                entry.valueType = abi.NVML_VALUE_TYPE_SIGNED_LONG_LONG
                entry.value.sllVal = max(value, -(2**63))
            else:
                entry.valueType = abi.NVML_VALUE_TYPE_DOUBLE
                entry.value.dVal = float(value)

    @staticmethod
    def _not_available(entry: Any) -> None:
        """SUCCESS with all ones in the value's C width: NVML's "not available"."""
        entry.nvmlReturn = abi.NVML_SUCCESS
        plain = PLAIN.get(entry.fieldId)
        if (plain is not None and plain[2] == U32_MAX) or entry.fieldId == _LINK_STATE:
            entry.valueType = abi.NVML_VALUE_TYPE_UNSIGNED_INT
            entry.value.uiVal = U32_MAX
        else:
            entry.valueType = abi.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            entry.value.ullVal = U64_MAX

    def _plain(self, entry: Any, gpu: GpuSpec, sample: int) -> int | None:
        """Fill a :data:`PLAIN` entry as its call would answer; the error code, if any."""
        symbol, value_of, maximum = PLAIN[entry.fieldId]
        code = gpu.faults.calls.get(symbol)
        if code:
            return code
        value = value_of(gpu)
        if value is None:
            return abi.NVML_ERROR_NOT_SUPPORTED
        entry.nvmlReturn = abi.NVML_SUCCESS
        number = clamp(value.at(sample, gpu.position), maximum)
        if maximum == U32_MAX:
            entry.valueType = abi.NVML_VALUE_TYPE_UNSIGNED_INT
            entry.value.uiVal = number
        else:
            entry.valueType = abi.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            entry.value.ullVal = number
        return None

    @staticmethod
    def _link_state(entry: Any, gpu: GpuSpec, sample: int) -> int | None:
        """A link's state at the entry's scope, as its call would answer; the error code."""
        code = gpu.faults.calls.get(_LINK_STATE_CALL)
        if code:
            return code
        if gpu.nvlink is None:
            return abi.NVML_ERROR_NOT_SUPPORTED
        link = int(entry.scopeId)
        if link >= len(gpu.nvlink.links):
            return abi.NVML_ERROR_INVALID_ARGUMENT
        entry.nvmlReturn = abi.NVML_SUCCESS
        entry.valueType = abi.NVML_VALUE_TYPE_UNSIGNED_INT
        entry.value.uiVal = (abi.NVML_NVLINK_STATE_ACTIVE
                             if gpu.nvlink.links[link].active_at(sample)
                             else abi.NVML_NVLINK_STATE_INACTIVE)
        return None
