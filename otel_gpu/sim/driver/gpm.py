"""GPM (GPU Performance Monitoring): the support query, sample buffers, samples and metrics.

A sample buffer is an opaque token handed out by ``nvmlGpmSampleAlloc``;
``nvmlGpmSampleGet`` (a GPU) and ``nvmlGpmMigSampleGet`` (one GPU instance of
it) record in it which device it was taken on and the collector sample it was
taken in. ``nvmlGpmMetricsGet`` on two buffers of the same device answers each
requested metric with the scenario's VALUE at the later buffer's sample, so
the rate over an interval is what the scenario says for the sample that ends
it; a metric the scenario does not list answers ``NOT_SUPPORTED`` in its
entry. A GPU without ``gpm`` is pre-Hopper: the support query says 0 and its
sample calls answer ``NOT_SUPPORTED``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import (
    DriverCore,
    Fail,
    Target,
    arg_int,
    c_symbol,
    deref,
    token_of,
    write_handle,
)
from otel_gpu.sim.scenario import Gpm, MigSpec

_FIRST_BUFFER = 0x6000_0000


@dataclass
class _Buffer:
    """One allocated sample buffer and, once filled, what it holds."""

    gpu: int | None = None
    """Index of the GPU the sample was taken on (None: never filled)."""
    gpu_instance_id: int | None = None
    """The GPU instance a MIG sample was taken for."""
    sample: int = 0
    """The collector sample it was taken in."""
    order: int = 0
    """Counts every sample taken by the driver: which of two buffers is later."""


class GpmSymbols(DriverCore):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._gpm_buffers: dict[int, _Buffer] = {}
        self._gpm_next = _FIRST_BUFFER
        self._gpm_taken = 0
        super().__init__(*args, **kwargs)

    @property
    def gpm_buffers(self) -> int:
        """Sample buffers allocated and not freed yet."""
        with self._lock:
            return len(self._gpm_buffers)

    def gpu_of(self, symbol: str, args: tuple[Any, ...]) -> int | None:
        """A metrics query or a freed buffer is about the GPU its (first) buffer was filled on."""
        if symbol not in ("nvmlGpmMetricsGet", "nvmlGpmSampleFree") or not args:
            return super().gpu_of(symbol, args)
        ref = deref(args[0]).sample1 if symbol == "nvmlGpmMetricsGet" else args[0]
        with self._lock:
            buffer = self._gpm_buffers.get(token_of(ref) or 0)
        return buffer.gpu if buffer is not None else None

    # --- support and buffers ------------------------------------------------------------

    @c_symbol
    def nvmlGpmQueryDeviceSupport(self, handle: Any, support_ref: Any) -> None:
        target, _ = self.check_device("nvmlGpmQueryDeviceSupport", handle)
        support = deref(support_ref)
        if support.version != abi.NVML_GPM_SUPPORT_VERSION:
            raise Fail(abi.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        gpm = target.gpu.gpm
        support.isSupportedDevice = int(gpm is not None and not gpm.unsupported)

    @c_symbol
    def nvmlGpmSampleAlloc(self, out: Any) -> None:
        self.check_system(None)
        with self._lock:
            token = self._gpm_next
            self._gpm_next += 1
            self._gpm_buffers[token] = _Buffer()
        write_handle(out, token)  # an opaque pointer, like a device handle

    @c_symbol
    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.check_system(None)
        with self._lock:
            if self._gpm_buffers.pop(token_of(sample) or 0, None) is None:
                raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)

    # --- samples ------------------------------------------------------------------------

    @c_symbol
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> None:
        target, now = self.check_device("nvmlGpmSampleGet", handle)
        self._sampling(target.gpu.gpm, now)
        self._fill(sample, target.gpu.index, None, now)

    @c_symbol
    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: Any, sample: Any) -> None:
        target, now = self.check_device("nvmlGpmMigSampleGet", handle)
        self._sampling(target.gpu.gpm, now)
        mig = self._instance(target, arg_int(gpu_instance_id), now)
        if mig.gpm is not None:
            self._sampling(mig.gpm, now, gpu=False)
        self._fill(sample, target.gpu.index, mig.gpu_instance_id, now)

    @staticmethod
    def _sampling(gpm: Gpm | None, sample: int, gpu: bool = True) -> None:
        """Whether counters can be sampled now: GPM present, allowed, and not held elsewhere."""
        if gpm is None or (gpu and gpm.unsupported):
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        if gpm.no_permission:
            raise Fail(abi.NVML_ERROR_NO_PERMISSION)
        if gpm.busy_at(sample):
            raise Fail(abi.NVML_ERROR_IN_USE)

    @staticmethod
    def _instance(target: Target, gpu_instance_id: int, sample: int) -> MigSpec:
        for mig in target.gpu.mig:
            if mig.gpu_instance_id == gpu_instance_id and mig.exists_at(sample):
                return mig
        raise Fail(abi.NVML_ERROR_NOT_FOUND)

    def _fill(self, sample: Any, gpu: int, gpu_instance_id: int | None, now: int) -> None:
        with self._lock:
            buffer = self._gpm_buffers.get(token_of(sample) or 0)
            if buffer is None:
                raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
            self._gpm_taken += 1
            buffer.gpu, buffer.gpu_instance_id = gpu, gpu_instance_id
            buffer.sample, buffer.order = now, self._gpm_taken

    # --- metrics ------------------------------------------------------------------------

    @c_symbol
    def nvmlGpmMetricsGet(self, metrics_ref: Any) -> None:
        self.check_system(None)
        request = deref(metrics_ref)
        if request.version != abi.NVML_GPM_METRICS_GET_VERSION:
            raise Fail(abi.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        count = int(request.numMetrics)
        if not 0 < count <= abi.NVML_GPM_METRIC_MAX:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            first = self._gpm_buffers.get(token_of(request.sample1) or 0)
            second = self._gpm_buffers.get(token_of(request.sample2) or 0)
        if (first is None or second is None or first is second or first.gpu is None
                or (first.gpu, first.gpu_instance_id) != (second.gpu, second.gpu_instance_id)):
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        later = max(first, second, key=lambda b: b.order)
        gpu = next(g for g in self.scenario.devices if g.index == later.gpu)
        if later.gpu_instance_id is None:
            spec = gpu.gpm
        else:
            spec = next((m.gpm for m in gpu.mig if m.gpu_instance_id == later.gpu_instance_id
                         and m.exists_at(later.sample)), None)
        answers = spec.metrics if spec is not None else {}
        for i in range(count):
            entry = request.metrics[i]
            value = answers.get(int(entry.metricId))
            if value is None:
                entry.nvmlReturn = abi.NVML_ERROR_NOT_SUPPORTED
                entry.value = 0.0
                continue
            entry.nvmlReturn = abi.NVML_SUCCESS
            entry.value = float(value.at(later.sample, gpu.position))
