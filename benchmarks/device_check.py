"""The real-GPU check: otel-gpu's every exported value against NVML itself, on one command.

The collector's tests run against the simulator; this check is what earns trust on a
driver no one here wrote. It starts the real ``otel-gpu`` process (``python -m
otel_gpu``) against the real driver, or with ``--simulate PROFILE`` so that CI keeps it
from rotting, and then:

1. **idle**: waits for the first sample (``/metrics`` answers 503 until then: polled
   with a deadline), then, on each fresh sample, reads pynvml right after the scrape and
   compares every exported series of every GPU: exact for what does not move (totals,
   maximum clocks, limits, identity), within a stated tolerance for what does (power,
   temperature, utilisation, clocks; counters such as energy may only have grown, by at
   most a stated rate times the time between the two reads). A value NVML refuses
   (NOT_SUPPORTED and every other error) must be an absent series. A moving value
   outside its tolerance gets a second try on a fresh sample. nvidia-smi ``-q -x`` is
   compared where it reports the same value (skipped, with a note, without
   nvidia-smi). A family exported that the check cannot compare is listed as "not
   compared", with its series count, so coverage is visible.
2. **load** (when torch or cupy imports): a bf16 matmul (fp16 with cupy) holding a few
   GiB, in a child process: everything compared again, GPM activities against pynvml's
   own GPM over a window of the same steady load, utilisation and power seen to move.
3. **pods**: the project's fake kubelet (``testkit.kubelet``: real gRPC on a unix
   socket) gives the GPU to one pod, then to two time-sliced pods; process usage is on,
   with a fake ``/proc`` cgroup tree and kubelet log directories
   (:func:`otel_gpu.sim.node.write_node`) placing the load processes (the simulator's
   processes in simulation) in those pods: pod labels, per-pod memory equal to NVML's
   per-process memory, per-pod energy summing to the GPU's.
4. **latency**: p50/p90 of each NVML function the collector calls (``--latency-calls``
   calls each).
5. **cost**: otel-gpu, nvitop-exporter (when importable) and the hand-written pynvml
   exporters (:mod:`benchmarks.handwritten`: the usual values, and ``handwritten-same``,
   the collector's reads), each under :mod:`benchmarks.launch`, which
   counts NVML calls at the library: CPU per sample and per gzip scrape from ``/proc``,
   RSS, NVML calls per GPU per sample.

It writes ``device-check.json`` and ``device-check.md`` to ``--out`` and exits 1 when a
comparison failed (2 on bad usage). In simulation the check's own pynvml reads go
through the same fake driver in a child process (:mod:`otel_gpu.sim.install`), read at
the sample the scrape shows; ``--reference-scenario`` makes that child read another
scenario, which must fail the check.

    python -m benchmarks.device_check --out DIR [--simulate h100x8]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import http.client
import importlib.util
import json
import math
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from otel_gpu import nvml_abi as abi

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
POLL = 0.02
"""Polling step of every wait on the collector (each wait has its own deadline)."""

# --------------------------------------------------------------------------- tolerances


@dataclass(frozen=True)
class Tol:
    """How an exported value is compared with the reference.

    ``exact``: equal (to 1e-9 relative, for float formatting). ``gauge``: within
    ``abs`` or ``rel`` times the reference, whichever is larger. ``counter``: the
    reference, read after the collector's read, is not below it and above it by at most
    ``rate`` per second of the time between the two reads (``abs`` either way: two calls
    for the same counter may be refreshed at different moments).
    """

    kind: str
    abs: float = 0.0
    rel: float = 0.0
    rate: float = 0.0
    text: str = ""

    @property
    def moving(self) -> bool:
        return self.kind != "exact"

    def ok(self, exported: float, reference: float, age: float) -> bool:
        slack = 1e-9 * max(abs(exported), abs(reference), 1.0)
        if self.kind == "exact":
            return abs(exported - reference) <= slack
        if self.kind == "gauge":
            return abs(exported - reference) <= max(self.abs, self.rel * abs(reference)) + slack
        return -self.abs - slack <= reference - exported <= self.rate * age + self.abs + slack

    def describe(self) -> str:
        return self.text or self.kind


EXACT = Tol("exact", text="exact")
UTIL = Tol("gauge", abs=0.25, text="±0.25 (NVML's own sampling period)")
TEMP = Tol("gauge", abs=5.0, text="±5 C")
POWER = Tol("gauge", abs=30.0, rel=0.15, text="±max(30 W, 15 %)")
CLOCK = Tol("gauge", abs=200e6, rel=0.20, text="±max(200 MHz, 20 %)")
MEMORY = Tol("gauge", abs=256 * MIB, text="±256 MiB")
MEMORY_FRACTION = Tol("gauge", abs=0.01, text="±0.01")
PSTATE = Tol("gauge", abs=2.0, text="±2")
FLAG = Tol("gauge", abs=0.0, text="equal (moves with load: second try)")
LINK = Tol("gauge", abs=0.0, text="equal (can change with load: second try)")
FAN = Tol("gauge", abs=0.10, text="±0.10")
GPM_ACTIVITY = Tol("gauge", abs=0.10, text="±0.10 over another window of the same load")
GPM_RATE = Tol("gauge", abs=512 * MIB, rel=0.5, text="±max(512 MiB/s, 50 %)")
PCIE_RATE = Tol("gauge", abs=256 * MIB, rel=0.5, text="±max(256 MiB/s, 50 %)")
ENERGY = Tol("counter", rate=2000.0, abs=2.0,
             text="grown by 0..2 kW x the reads' gap, ±2 J")
THROTTLE_TIME = Tol("counter", rate=1.0, abs=1e-6, text="grown by 0..1 s/s x the reads' gap")
PCIE_BYTES = Tol("counter", rate=128e9, text="grown by 0..128 GB/s x the reads' gap")
NVLINK_BYTES = Tol("counter", rate=2e12, text="grown by 0..2 TB/s x the reads' gap")
GAP_SLACK = 0.25
"""Seconds added to the measured gap between the collector's read and the check's."""

# --------------------------------------------------------------------------- the table

THROTTLE_BITS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
    "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
POLICIES = ("power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability")
CLOCK_DOMAINS = ("sm", "memory", "graphics", "video")
GPM_METRICS = {
    "GRAPHICS_UTIL": "graphics", "SM_UTIL": "sm", "SM_OCCUPANCY": "occupancy",
    "ANY_TENSOR_UTIL": "tensor.any", "HMMA_TENSOR_UTIL": "tensor.hmma",
    "IMMA_TENSOR_UTIL": "tensor.imma", "DFMA_TENSOR_UTIL": "tensor.dfma",
    "DMMA_TENSOR_UTIL": "tensor.dmma", "FP64_UTIL": "pipe.fp64", "FP32_UTIL": "pipe.fp32",
    "FP16_UTIL": "pipe.fp16", "INTEGER_UTIL": "pipe.integer", "DRAM_BW_UTIL": "dram",
    "PCIE_TX_PER_SEC": "pcie.tx", "PCIE_RX_PER_SEC": "pcie.rx",
    "NVLINK_TOTAL_TX_PER_SEC": "nvlink.tx", "NVLINK_TOTAL_RX_PER_SEC": "nvlink.rx",
}
GPM_ENGINES = {"nvdec": ("NVDEC", 8), "nvjpg": ("NVJPG", 8), "nvofa": ("NVOFA", 2)}


@dataclass(frozen=True)
class Spec:
    """One exported series per GPU (``family`` with ``labels``) and the reference reading
    it must equal: ``key`` of the reader's readings, times ``scale``."""

    family: str
    key: str
    tol: Tol
    labels: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0


def _specs() -> list[Spec]:
    def s(family: str, key: str, tol: Tol, scale: float = 1.0, **labels: str) -> Spec:
        return Spec(family, key, tol, tuple(sorted(labels.items())), scale)

    out = [
        s("hw_gpu_utilization", "util.gpu", UTIL, 0.01, hw_gpu_task="general"),
        s("hw_gpu_utilization", "util.encoder", UTIL, 0.01, hw_gpu_task="encoder"),
        s("hw_gpu_utilization", "util.decoder", UTIL, 0.01, hw_gpu_task="decoder"),
        s("nvidia_gpu_memory_controller_utilization", "util.memory", UTIL, 0.01),
        s("hw_gpu_memory_limit_bytes", "mem.total", EXACT),
        s("hw_gpu_memory_usage_bytes", "mem.used", MEMORY),
        s("nvidia_gpu_memory_free_bytes", "mem.free", MEMORY),
        s("nvidia_gpu_memory_reserved_bytes", "mem.reserved", EXACT),
        s("hw_gpu_memory_utilization", "mem.fraction", MEMORY_FRACTION),
        s("hw_power_watts", "power", POWER, 0.001),
        s("hw_energy_joules_total", "energy", ENERGY, 0.001),
        s("hw_temperature_celsius", "temp.gpu", TEMP, hw_sensor_location="gpu"),
        s("hw_temperature_celsius", "temp.memory", TEMP, hw_sensor_location="memory"),
        s("hw_gpu_io_bytes_total", "pcie.rx_bytes", PCIE_BYTES, network_io_direction="receive"),
        s("hw_gpu_io_bytes_total", "pcie.tx_bytes", PCIE_BYTES,
          network_io_direction="transmit"),
        s("hw_errors_total", "ecc.corrected.volatile", EXACT, error_type="corrected"),
        s("hw_errors_total", "ecc.uncorrected.volatile", EXACT, error_type="uncorrected"),
        s("nvidia_gpu_performance_state", "pstate", PSTATE),
        s("nvidia_gpu_pcie_replays_total", "pcie.replays", EXACT),
        s("nvidia_gpu_pcie_link_generation", "pcie.gen", LINK),
        s("nvidia_gpu_pcie_link_max_generation", "pcie.max_gen", EXACT),
        s("nvidia_gpu_pcie_link_width", "pcie.width", LINK),
        s("nvidia_gpu_pcie_link_max_width", "pcie.max_width", EXACT),
        s("nvidia_gpu_pcie_sampled_throughput_bytes_per_second", "pcie.rx_rate", PCIE_RATE,
          1024, network_io_direction="receive"),
        s("nvidia_gpu_pcie_sampled_throughput_bytes_per_second", "pcie.tx_rate", PCIE_RATE,
          1024, network_io_direction="transmit"),
        s("nvidia_gpu_nvlink_io_bytes_total", "nvlink.rx", NVLINK_BYTES, 1024,
          network_io_direction="receive"),
        s("nvidia_gpu_nvlink_io_bytes_total", "nvlink.tx", NVLINK_BYTES, 1024,
          network_io_direction="transmit"),
        s("nvidia_gpu_nvlink_links", "nvlink.links", LINK),
        s("nvidia_gpu_fan_speed", "fan", FAN, 0.01),
        s("nvidia_gpu_memory_remapped_rows_total", "remap.cor", EXACT, error_type="corrected"),
        s("nvidia_gpu_memory_remapped_rows_total", "remap.unc", EXACT,
          error_type="uncorrected"),
        s("nvidia_gpu_memory_row_remap_pending", "remap.pending", EXACT),
        s("nvidia_gpu_memory_row_remap_failure", "remap.failure", EXACT),
        s("nvidia_gpu_memory_retired_pages_total", "retired.sbe", EXACT,
          nvidia_gpu_page_retirement_cause="multiple_single_bit_ecc"),
        s("nvidia_gpu_memory_retired_pages_total", "retired.dbe", EXACT,
          nvidia_gpu_page_retirement_cause="double_bit_ecc"),
        s("nvidia_gpu_memory_page_retirement_pending", "retired.pending", EXACT),
        s("nvidia_gpu_processes", "procs", EXACT),
        s("nvidia_gpu_graphics_activity", "gpm.graphics", GPM_ACTIVITY, 0.01),
        s("nvidia_gpu_sm_activity", "gpm.sm", GPM_ACTIVITY, 0.01),
        s("nvidia_gpu_sm_occupancy", "gpm.occupancy", GPM_ACTIVITY, 0.01),
        s("nvidia_gpu_dram_activity", "gpm.dram", GPM_ACTIVITY, 0.01),
        s("nvidia_gpu_pcie_throughput_bytes_per_second", "gpm.pcie.rx", GPM_RATE, MIB,
          network_io_direction="receive"),
        s("nvidia_gpu_pcie_throughput_bytes_per_second", "gpm.pcie.tx", GPM_RATE, MIB,
          network_io_direction="transmit"),
        s("nvidia_gpu_nvlink_throughput_bytes_per_second", "gpm.nvlink.rx", GPM_RATE, MIB,
          network_io_direction="receive"),
        s("nvidia_gpu_nvlink_throughput_bytes_per_second", "gpm.nvlink.tx", GPM_RATE, MIB,
          network_io_direction="transmit"),
    ]
    for domain in CLOCK_DOMAINS:
        out.append(s("nvidia_gpu_clock_frequency_hertz", f"clock.{domain}", CLOCK, 1e6,
                     nvidia_gpu_clock_domain=domain))
        out.append(s("nvidia_gpu_clock_max_frequency_hertz", f"max_clock.{domain}", EXACT, 1e6,
                     nvidia_gpu_clock_domain=domain))
    for kind in ("current", "enforced", "default", "min", "max"):
        out.append(s("nvidia_gpu_power_limit_watts", f"plimit.{kind}", EXACT, 0.001,
                     nvidia_gpu_power_limit_type=kind))
    for reason in THROTTLE_BITS:
        out.append(s("nvidia_gpu_clock_throttle", f"throttle.{reason}", FLAG,
                     nvidia_gpu_throttle_reason=reason))
    for policy in POLICIES:
        out.append(s("nvidia_gpu_clock_throttle_time_seconds_total", f"violation.{policy}",
                     THROTTLE_TIME, 1e-9, nvidia_gpu_throttle_reason=policy))
    for kind in ("crc_flit", "crc_data", "replay", "recovery"):
        out.append(s("nvidia_gpu_nvlink_errors_total", f"nvlink.{kind}", EXACT,
                     error_type=kind))
    for bucket in ("max", "high", "partial", "low", "none"):
        out.append(s("nvidia_gpu_memory_row_remap_banks", f"hist.{bucket}", EXACT,
                     nvidia_gpu_row_remap_availability=bucket))
    for error in ("corrected", "uncorrected"):
        for counter in ("volatile", "aggregate"):
            out.append(s("nvidia_gpu_ecc_errors_total", f"ecc.{error}.{counter}", EXACT,
                         error_type=error, nvidia_gpu_ecc_counter_type=counter))
    for kind in ("any", "hmma", "imma", "dfma", "dmma"):
        out.append(s("nvidia_gpu_tensor_activity", f"gpm.tensor.{kind}", GPM_ACTIVITY, 0.01,
                     nvidia_gpu_tensor_type=kind))
    for pipe in ("fp64", "fp32", "fp16", "integer"):
        out.append(s("nvidia_gpu_pipe_activity", f"gpm.pipe.{pipe}", GPM_ACTIVITY, 0.01,
                     nvidia_gpu_pipe=pipe))
    for engine in GPM_ENGINES:
        out.append(s("nvidia_gpu_engine_utilization", f"gpm.{engine}", GPM_ACTIVITY, 0.01,
                     nvidia_gpu_engine=engine))
    return out


SPECS = _specs()
CUSTOM = {
    "hw_status": "the device state from remapped rows and retired pages",
    "nvidia_gpu_info": "identity labels against NVML's name, serial, PCI bus id, index, driver",
    "otel_gpu_devices": "GPUs and MIG instances NVML counts",
    "otel_gpu_device_sample_age_seconds": "at most two intervals",
    "otel_gpu_sample_age_seconds": "at most two intervals",
    "otel_gpu_sample_duration_seconds": "at most one interval",
    "otel_gpu_samples_total": "at least 1, at most the collector's age over the interval, + 2",
    "nvidia_gpu_k8s_energy_joules_total": "per GPU, the rows sum to hw_energy (1 mJ)",
    "nvidia_gpu_k8s_energy_rule": "the rule the pods phase implies",
    "nvidia_gpu_k8s_allocation": "the fake kubelet's pods",
    "nvidia_gpu_k8s_allocated": "the fake kubelet's device ids",
    "nvidia_gpu_k8s_memory_usage_bytes": "NVML's per-process memory, summed per pod",
    "nvidia_gpu_k8s_processes": "NVML's processes, counted per pod",
    "nvidia_gpu_k8s_sm_utilization": "NVML's per-process SM shares (±0.3)",
    "otel_gpu_kubelet_pods": "the fake kubelet's pods",
    "otel_gpu_kubelet_devices": "devices the fake kubelet's pods hold",
    "otel_gpu_kubelet_unresolved_ids": "0",
}
IDENTITY_LABELS = ("hw_id", "hw_type", "nvidia_gpu_index")

# --------------------------------------------------------------------------- results


@dataclass
class Row:
    """One comparison: what was exported, what the reference says, the rule, the result."""

    phase: str
    family: str
    device: str
    what: str
    exported: Any
    reference: Any
    rule: str
    ok: bool
    source: str = "pynvml"
    note: str = ""


@dataclass
class Result:
    """Everything the check found, written as JSON and rendered as markdown."""

    started: str
    mode: str
    command: list[str]
    environment: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    not_compared: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if not r.ok]

    @property
    def passed(self) -> bool:
        return bool(self.rows) and not self.failed and not self.errors

    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"device-check: {text}", file=sys.stderr)


# --------------------------------------------------------------------------- the reader


def _nvml_error(exc: BaseException) -> str:
    return f"ERR:{exc}"


def _refused(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("ERR:")


class Readings:
    """pynvml's answers for one GPU, each from the first way that gives one: the plain call
    first, the field value where the call is missing or refused."""

    def __init__(self, m: Any) -> None:
        self.m = m
        self.out: dict[str, Any] = {}

    def take(self, key: str, *ways: Callable[[], Any]) -> Any:
        first_error = None
        for way in ways:
            try:
                value = way()
            except self.m.NVMLError as exc:
                if first_error is None or "Function Not Found" in first_error:
                    first_error = _nvml_error(exc)
                continue
            self.out[key] = value
            return value
        self.out[key] = first_error or "ERR:no way to read it"
        return None

    def field(self, handle: Any, field_id: int, scope: int = 0) -> Callable[[], Any]:
        """A way that reads one field value alone (the collector batches them)."""
        m = self.m

        def read() -> Any:
            (value,) = m.nvmlDeviceGetFieldValues(handle, [(field_id, scope)])
            if value.nvmlReturn != abi.NVML_SUCCESS:
                raise m.NVMLError(value.nvmlReturn)
            kind = value.valueType
            union = value.value
            return {abi.NVML_VALUE_TYPE_DOUBLE: union.dVal,
                    abi.NVML_VALUE_TYPE_UNSIGNED_INT: union.uiVal,
                    abi.NVML_VALUE_TYPE_UNSIGNED_LONG: union.ulVal,
                    abi.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: union.ullVal,
                    abi.NVML_VALUE_TYPE_SIGNED_LONG_LONG: union.sllVal}.get(kind, union.ullVal)
        return read


def _not_available(value: Any, bits: int = 32) -> Any:
    """NVML's "not available" all-ones answered with SUCCESS: an absent series."""
    if isinstance(value, int) and value in ((1 << 32) - 1, (1 << 64) - 1, (1 << bits) - 1):
        return "ERR:not available (all ones)"
    return value


def read_gpu(m: Any, handle: Any) -> dict[str, Any]:
    """Every value otel-gpu exports for one GPU, read with plain pynvml calls."""
    r = Readings(m)
    t = r.take
    f = r.field
    t("uuid", lambda: m.nvmlDeviceGetUUID(handle))
    t("name", lambda: m.nvmlDeviceGetName(handle))
    t("index", lambda: m.nvmlDeviceGetIndex(handle))
    t("serial", lambda: m.nvmlDeviceGetSerial(handle))
    t("pci_bus_id", lambda: _text(m.nvmlDeviceGetPciInfo(handle).busId))
    t("numa", lambda: m.nvmlDeviceGetNumaNodeId(handle))
    mem = t("mem", lambda: m.nvmlDeviceGetMemoryInfo(handle, version=m.nvmlMemory_v2),
            lambda: m.nvmlDeviceGetMemoryInfo(handle))
    r.out.pop("mem", None)
    if mem is None:
        for key in ("mem.total", "mem.used", "mem.free", "mem.reserved", "mem.fraction"):
            r.out[key] = "ERR:memory info refused"
    else:
        r.out.update({"mem.total": mem.total, "mem.used": mem.used, "mem.free": mem.free,
                      "mem.reserved": getattr(mem, "reserved", "ERR:v1 only"),
                      "mem.fraction": mem.used / mem.total if mem.total else "ERR:total 0"})
    util = t("util", lambda: m.nvmlDeviceGetUtilizationRates(handle))
    r.out.pop("util", None)
    r.out["util.gpu"] = util.gpu if util is not None else "ERR:utilization refused"
    r.out["util.memory"] = util.memory if util is not None else "ERR:utilization refused"
    t("util.encoder", lambda: m.nvmlDeviceGetEncoderUtilization(handle)[0])
    t("util.decoder", lambda: m.nvmlDeviceGetDecoderUtilization(handle)[0])
    t("temp.gpu", lambda: m.nvmlDeviceGetTemperature(handle, abi.NVML_TEMPERATURE_GPU))
    t("temp.memory", f(handle, abi.NVML_FI_DEV_MEMORY_TEMP))
    t("power", lambda: m.nvmlDeviceGetPowerUsage(handle))
    t("energy", lambda: m.nvmlDeviceGetTotalEnergyConsumption(handle),
      f(handle, abi.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION))
    clocks = {"sm": abi.NVML_CLOCK_SM, "memory": abi.NVML_CLOCK_MEM,
              "graphics": abi.NVML_CLOCK_GRAPHICS, "video": abi.NVML_CLOCK_VIDEO}
    for domain, clock in clocks.items():
        t(f"clock.{domain}", lambda c=clock: m.nvmlDeviceGetClockInfo(handle, c))
        t(f"max_clock.{domain}", lambda c=clock: m.nvmlDeviceGetMaxClockInfo(handle, c))
    pstate = t("pstate", lambda: m.nvmlDeviceGetPerformanceState(handle))
    if pstate is not None and pstate >= 16:
        r.out["pstate"] = "ERR:unknown P-state"
    t("plimit.current", lambda: m.nvmlDeviceGetPowerManagementLimit(handle))
    t("plimit.enforced", lambda: m.nvmlDeviceGetEnforcedPowerLimit(handle))
    t("plimit.default", lambda: m.nvmlDeviceGetPowerManagementDefaultLimit(handle))
    limits = t("plimits", lambda: m.nvmlDeviceGetPowerManagementLimitConstraints(handle))
    r.out.pop("plimits", None)
    r.out["plimit.min"] = limits[0] if limits else "ERR:constraints refused"
    r.out["plimit.max"] = limits[1] if limits else "ERR:constraints refused"
    t("pcie.gen", lambda: m.nvmlDeviceGetCurrPcieLinkGeneration(handle))
    t("pcie.max_gen", lambda: m.nvmlDeviceGetMaxPcieLinkGeneration(handle))
    t("pcie.width", lambda: m.nvmlDeviceGetCurrPcieLinkWidth(handle))
    t("pcie.max_width", lambda: m.nvmlDeviceGetMaxPcieLinkWidth(handle))
    t("pcie.replays", lambda: m.nvmlDeviceGetPcieReplayCounter(handle),
      f(handle, abi.NVML_FI_DEV_PCIE_REPLAY_COUNTER))
    rx = t("pcie.rx_bytes", f(handle, abi.NVML_FI_DEV_PCIE_COUNT_RX_BYTES))
    tx = t("pcie.tx_bytes", f(handle, abi.NVML_FI_DEV_PCIE_COUNT_TX_BYTES))
    if rx is None or tx is None:  # the collector samples throughput only then
        t("pcie.rx_rate",
          lambda: m.nvmlDeviceGetPcieThroughput(handle, abi.NVML_PCIE_UTIL_RX_BYTES))
        t("pcie.tx_rate",
          lambda: m.nvmlDeviceGetPcieThroughput(handle, abi.NVML_PCIE_UTIL_TX_BYTES))
    else:
        r.out["pcie.rx_rate"] = r.out["pcie.tx_rate"] = "ERR:byte counters read instead"
    _nvlink(r, handle)
    reasons = t("throttle", lambda: m.nvmlDeviceGetCurrentClocksEventReasons(handle),
                lambda: m.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
    for reason, bit in THROTTLE_BITS.items():
        r.out[f"throttle.{reason}"] = (int(bool(reasons & bit)) if reasons is not None
                                       else r.out["throttle"])
    fields = (abi.NVML_FI_DEV_PERF_POLICY_POWER, abi.NVML_FI_DEV_PERF_POLICY_THERMAL,
              abi.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST, abi.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT,
              abi.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION, abi.NVML_FI_DEV_PERF_POLICY_RELIABILITY)
    for number, (policy, field_id) in enumerate(zip(POLICIES, fields, strict=True)):
        t(f"violation.{policy}",
          lambda p=number: m.nvmlDeviceGetViolationStatus(handle, p).violationTime,
          f(handle, field_id))
    t("fan", lambda: m.nvmlDeviceGetFanSpeed(handle))
    rows = t("remap", lambda: m.nvmlDeviceGetRemappedRows(handle))
    ways = {"cor": abi.NVML_FI_DEV_REMAPPED_COR, "unc": abi.NVML_FI_DEV_REMAPPED_UNC,
            "pending": abi.NVML_FI_DEV_REMAPPED_PENDING,
            "failure": abi.NVML_FI_DEV_REMAPPED_FAILURE}
    for i, (name, field_id) in enumerate(ways.items()):
        if rows is not None:
            r.out[f"remap.{name}"] = int(rows[i])
        else:
            t(f"remap.{name}", f(handle, field_id))
    r.out.pop("remap", None)
    hist = t("hist", lambda: m.nvmlDeviceGetRowRemapperHistogram(handle))
    r.out.pop("hist", None)
    for bucket in ("max", "high", "partial", "low", "none"):
        r.out[f"hist.{bucket}"] = (getattr(hist, bucket) if hist is not None
                                   else "ERR:histogram refused")
    causes = {"sbe": (m.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                      abi.NVML_FI_DEV_RETIRED_SBE),
              "dbe": (m.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                      abi.NVML_FI_DEV_RETIRED_DBE)}
    for name, (cause, field_id) in causes.items():
        t(f"retired.{name}", lambda c=cause: len(m.nvmlDeviceGetRetiredPages(handle, c)),
          f(handle, field_id))
    t("retired.pending", lambda: int(m.nvmlDeviceGetRetiredPagesPendingStatus(handle)),
      f(handle, abi.NVML_FI_DEV_RETIRED_PENDING))
    ecc_fields = {("corrected", "volatile"): abi.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
                  ("uncorrected", "volatile"): abi.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
                  ("corrected", "aggregate"): abi.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
                  ("uncorrected", "aggregate"): abi.NVML_FI_DEV_ECC_DBE_AGG_TOTAL}
    for (error, counter), field_id in ecc_fields.items():
        error_type = (m.NVML_MEMORY_ERROR_TYPE_CORRECTED if error == "corrected"
                      else m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        counter_type = m.NVML_VOLATILE_ECC if counter == "volatile" else m.NVML_AGGREGATE_ECC
        t(f"ecc.{error}.{counter}",
          lambda e=error_type, c=counter_type: m.nvmlDeviceGetTotalEccErrors(handle, e, c),
          f(handle, field_id))
    procs = t("processes", lambda: [(p.pid, p.usedGpuMemory)
                                    for p in m.nvmlDeviceGetComputeRunningProcesses(handle)])
    r.out["procs"] = len(procs) if procs is not None else r.out["processes"]
    for key, value in list(r.out.items()):
        if key not in ("processes", "uuid", "name", "serial", "pci_bus_id", "index"):
            r.out[key] = _not_available(value)
    _state(r.out)
    return r.out


def _nvlink(r: Readings, handle: Any) -> None:
    m = r.m
    active, refused = 0, None
    for link in range(abi.NVML_NVLINK_MAX_LINKS):
        try:
            active += int(m.nvmlDeviceGetNvLinkState(handle, link) == abi.NVML_FEATURE_ENABLED)
        except m.NVMLError as exc:
            if link == 0:
                refused = _nvml_error(exc)
            break
    keys = ("nvlink.rx", "nvlink.tx", "nvlink.crc_flit", "nvlink.crc_data", "nvlink.replay",
            "nvlink.recovery")
    if refused or not active:
        r.out["nvlink.links"] = refused or "ERR:no active link"
        r.out.update(dict.fromkeys(keys, refused or "ERR:no active link"))
        return
    r.out["nvlink.links"] = active
    all_links = 0xFFFFFFFF
    r.take("nvlink.rx", r.field(handle, abi.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, all_links))
    r.take("nvlink.tx", r.field(handle, abi.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, all_links))
    for name, field_id in (("crc_flit", abi.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
                           ("crc_data", abi.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL),
                           ("replay", abi.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL),
                           ("recovery", abi.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL)):
        r.take(f"nvlink.{name}", r.field(handle, field_id))


def _state(out: dict[str, Any]) -> None:
    """The device state hw_status must show, from what the reference read."""
    def flag(key: str) -> bool:
        return out.get(key) == 1

    if flag("remap.failure"):
        out["state"] = "predicted_failure"
    elif flag("remap.pending") or flag("retired.pending"):
        out["state"] = "degraded"
    else:
        out["state"] = "ok"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Gpm:
    """pynvml's own GPM: two samples of a GPU and the metrics between them."""

    def __init__(self, m: Any) -> None:
        self.m = m
        self.ids = {getattr(abi, f"NVML_GPM_METRIC_{name}"): name for name in GPM_METRICS
                    if hasattr(abi, f"NVML_GPM_METRIC_{name}")}
        for prefix, count in GPM_ENGINES.values():
            for i in range(count):
                name = f"{prefix}_{i}_UTIL"
                if hasattr(abi, f"NVML_GPM_METRIC_{name}"):
                    self.ids[getattr(abi, f"NVML_GPM_METRIC_{name}")] = name

    def supported(self, handle: Any) -> str | None:
        """None when the GPU has GPM, else why not."""
        try:
            ok = self.m.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice
        except self.m.NVMLError as exc:
            return _nvml_error(exc)
        return None if ok else "ERR:no GPM (before Hopper)"

    def begin(self, handle: Any) -> Any:
        buf = self.m.nvmlGpmSampleAlloc()
        self.m.nvmlGpmSampleGet(handle, buf)
        return buf

    def end(self, handle: Any, first: Any) -> dict[str, Any]:
        m = self.m
        second = m.nvmlGpmSampleAlloc()
        try:
            m.nvmlGpmSampleGet(handle, second)
            answers: dict[str, Any] = {}
            ids = list(self.ids)
            for start in range(0, len(ids), 98):  # NVML_GPM_METRIC_MAX per request
                chunk = ids[start:start + 98]
                req = m.c_nvmlGpmMetricsGet_t()
                req.version = abi.NVML_GPM_METRICS_GET_VERSION
                req.numMetrics = len(chunk)
                req.sample1, req.sample2 = first, second
                for i, metric in enumerate(chunk):
                    req.metrics[i].metricId = metric
                m.nvmlGpmMetricsGet(req)
                for i, metric in enumerate(chunk):
                    entry = req.metrics[i]
                    answers[self.ids[metric]] = (
                        entry.value if entry.nvmlReturn == abi.NVML_SUCCESS
                        else f"ERR:{m.nvmlErrorString(entry.nvmlReturn)}")
            return self.keys(answers)
        finally:
            m.nvmlGpmSampleFree(second)
            m.nvmlGpmSampleFree(first)

    @staticmethod
    def keys(answers: dict[str, Any]) -> dict[str, Any]:
        out = {f"gpm.{key}": answers.get(name, "ERR:not asked")
               for name, key in GPM_METRICS.items()}
        for engine, (prefix, count) in GPM_ENGINES.items():
            got = [answers[f"{prefix}_{i}_UTIL"] for i in range(count)
                   if not _refused(answers.get(f"{prefix}_{i}_UTIL", "ERR:"))]
            out[f"gpm.{engine}"] = statistics.fmean(got) if got else "ERR:no engine answers"
        return out


def reader_main(simulate: str | None) -> int:
    """The reference: answers JSON requests on stdin with pynvml's readings on stdout.

    In simulation it installs the simulator's driver for ``simulate`` first, and each
    read is taken at the simulator sample the request names (the collector's).
    """
    import pynvml as m

    fake = None
    if simulate:
        from otel_gpu import sim

        fake = sim.FakeNvml(sim.load_scenario(simulate))
        sim.install(fake)
    m.nvmlInit()
    handles = [m.nvmlDeviceGetHandleByIndex(i) for i in range(m.nvmlDeviceGetCount())]
    gpm = Gpm(m)
    out = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        try:
            answer = _serve(m, fake, handles, gpm, req)
        except Exception as exc:  # noqa: BLE001 - the check reports it, the reader goes on
            answer = {"error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


def _at_sample(m: Any, fake: Any, sample: int | None) -> None:
    """Put the simulator at ``sample``: its readings are a function of the sample number,
    which advances at each device count (the collector counts once per sample)."""
    if fake is None or sample is None:
        return
    with fake._lock:
        fake._sample = sample - 1
    m.nvmlDeviceGetCount()
    if fake.sample != sample:
        raise RuntimeError(f"the simulator is at sample {fake.sample}, not {sample}")


def _serve(m: Any, fake: Any, handles: list[Any], gpm: Gpm, req: dict[str, Any]) -> Any:
    op = req["op"]
    if op == "hello":
        return {"driver": _text(m.nvmlSystemGetDriverVersion()),
                "nvml": _text(m.nvmlSystemGetNVMLVersion()),
                "pynvml": _pynvml_version(),
                "gpus": [{"index": i, "uuid": _text(m.nvmlDeviceGetUUID(h)),
                          "name": _text(m.nvmlDeviceGetName(h))}
                         for i, h in enumerate(handles)]}
    if op == "read":
        _at_sample(m, fake, req.get("sample"))
        started = time.monotonic()
        firsts = {}
        for i, h in enumerate(handles):
            why = gpm.supported(h)
            if why is None:
                try:
                    firsts[i] = gpm.begin(h)
                except m.NVMLError as exc:
                    why = _nvml_error(exc)
            firsts.setdefault(i, why)
        gpus = {}
        for i, h in enumerate(handles):
            gpus[i] = read_gpu(m, h)
        window = float(req.get("gpm_window", 0.5))
        rest = started + window - time.monotonic()
        if rest > 0:
            time.sleep(rest)  # GPM's measurement window, not a wait for an event
        for i, h in enumerate(handles):
            first = firsts[i]
            if isinstance(first, str):
                gpus[i].update(Gpm.keys(dict.fromkeys(gpm.ids.values(), first)))
            else:
                try:
                    gpus[i].update(gpm.end(h, first))
                except m.NVMLError as exc:
                    gpus[i].update(Gpm.keys(dict.fromkeys(gpm.ids.values(),
                                                          _nvml_error(exc))))
        return {"gpus": {g["uuid"]: g for g in gpus.values()},
                "read_s": time.monotonic() - started}
    if op == "procs":
        _at_sample(m, fake, req.get("sample"))
        out: dict[str, Any] = {}
        for h in handles:
            try:
                out[_text(m.nvmlDeviceGetUUID(h))] = [
                    [p.pid, p.usedGpuMemory] for p in m.nvmlDeviceGetComputeRunningProcesses(h)]
            except m.NVMLError as exc:
                out[_text(m.nvmlDeviceGetUUID(h))] = _nvml_error(exc)
        return out
    if op == "proc_util":
        _at_sample(m, fake, req.get("sample"))
        h = handles[int(req["index"])]
        since = int((time.time() - float(req.get("seconds", 2.0))) * 1e6)
        try:
            samples = m.nvmlDeviceGetProcessUtilization(h, since)
        except m.NVMLError as exc:
            return {"error_code": _nvml_error(exc)}
        shares: dict[int, list[tuple[float, ...]]] = {}
        for s in samples:
            shares.setdefault(int(s.pid), []).append(
                (s.smUtil, s.memUtil, s.encUtil, s.decUtil))
        return {str(pid): [statistics.fmean(x[i] for x in v) / 100 for i in range(4)]
                for pid, v in shares.items()}
    if op == "latency":
        return latency(m, handles[0], int(req["calls"]), req.get("symbols") or [])
    raise ValueError(f"unknown op {op!r}")


def _pynvml_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return "unknown"


class Reader:
    """The main process's side of :func:`reader_main`: one request at a time, bounded."""

    def __init__(self, simulate: str | None) -> None:
        argv = [sys.executable, "-m", "benchmarks.device_check", "_reader"]
        if simulate:
            argv += ["--simulate", simulate]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._lines: queue.Queue[str] = queue.Queue()
        self._err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err = (self._err + [line.rstrip()])[-30:]

    def ask(self, op: str, timeout: float = 60.0, **kw: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the pynvml reader did not answer {op} in {timeout:g} s") \
                from None
        if not line:
            raise RuntimeError("the pynvml reader exited:\n" + "\n".join(self._err))
        answer = json.loads(line)
        if isinstance(answer, dict) and "error" in answer and "traceback" in answer:
            raise RuntimeError(f"the pynvml reader failed in {op}: {answer['traceback']}")
        return answer

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


# --------------------------------------------------------------------------- NVML latency


def latency(m: Any, h: Any, calls: int, symbols: list[str]) -> dict[str, Any]:
    """p50/p90 in microseconds of ``calls`` calls of each function (the collector's, as
    counted at the library, when ``symbols`` names them)."""
    fields = [(fid, 0) for fid in (
        abi.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, abi.NVML_FI_DEV_POWER_AVERAGE,
        abi.NVML_FI_DEV_MEMORY_TEMP, abi.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        abi.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, abi.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        abi.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, abi.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        abi.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, abi.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        abi.NVML_FI_DEV_REMAPPED_COR, abi.NVML_FI_DEV_REMAPPED_UNC,
        abi.NVML_FI_DEV_REMAPPED_PENDING,
        abi.NVML_FI_DEV_REMAPPED_FAILURE, abi.NVML_FI_DEV_PERF_POLICY_POWER,
        abi.NVML_FI_DEV_PERF_POLICY_THERMAL, abi.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
        abi.NVML_FI_DEV_POWER_REQUESTED_LIMIT, abi.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        abi.NVML_FI_DEV_POWER_DEFAULT_LIMIT, abi.NVML_FI_DEV_POWER_MIN_LIMIT,
        abi.NVML_FI_DEV_POWER_MAX_LIMIT)]
    table: dict[str, Callable[[], Any]] = {
        "nvmlDeviceGetCount_v2": m.nvmlDeviceGetCount,
        "nvmlDeviceGetHandleByIndex_v2": lambda: m.nvmlDeviceGetHandleByIndex(0),
        "nvmlDeviceGetUUID": lambda: m.nvmlDeviceGetUUID(h),
        "nvmlDeviceGetMemoryInfo_v2": lambda: m.nvmlDeviceGetMemoryInfo(h, m.nvmlMemory_v2),
        "nvmlDeviceGetMemoryInfo": lambda: m.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetUtilizationRates": lambda: m.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetEncoderUtilization": lambda: m.nvmlDeviceGetEncoderUtilization(h),
        "nvmlDeviceGetDecoderUtilization": lambda: m.nvmlDeviceGetDecoderUtilization(h),
        "nvmlDeviceGetTemperature": lambda: m.nvmlDeviceGetTemperature(h, 0),
        "nvmlDeviceGetTemperatureV": lambda: m.nvmlDeviceGetTemperatureV(h, 0),
        "nvmlDeviceGetPowerUsage": lambda: m.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetTotalEnergyConsumption": lambda: m.nvmlDeviceGetTotalEnergyConsumption(h),
        "nvmlDeviceGetFieldValues": lambda: m.nvmlDeviceGetFieldValues(h, fields),
        "nvmlDeviceGetClockInfo": lambda: m.nvmlDeviceGetClockInfo(h, abi.NVML_CLOCK_SM),
        "nvmlDeviceGetMaxClockInfo": lambda: m.nvmlDeviceGetMaxClockInfo(h, abi.NVML_CLOCK_SM),
        "nvmlDeviceGetPerformanceState": lambda: m.nvmlDeviceGetPerformanceState(h),
        "nvmlDeviceGetCurrentClocksEventReasons":
            lambda: m.nvmlDeviceGetCurrentClocksEventReasons(h),
        "nvmlDeviceGetComputeRunningProcesses_v3":
            lambda: m.nvmlDeviceGetComputeRunningProcesses(h),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda: m.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "nvmlDeviceGetCurrPcieLinkWidth": lambda: m.nvmlDeviceGetCurrPcieLinkWidth(h),
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda: m.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "nvmlDeviceGetMaxPcieLinkWidth": lambda: m.nvmlDeviceGetMaxPcieLinkWidth(h),
        "nvmlDeviceGetPcieThroughput":
            lambda: m.nvmlDeviceGetPcieThroughput(h, abi.NVML_PCIE_UTIL_TX_BYTES),
        "nvmlDeviceGetRowRemapperHistogram": lambda: m.nvmlDeviceGetRowRemapperHistogram(h),
        "nvmlDeviceGetViolationStatus": lambda: m.nvmlDeviceGetViolationStatus(h, 0),
        "nvmlDeviceGetFanSpeed": lambda: m.nvmlDeviceGetFanSpeed(h),
        "nvmlDeviceGetNvLinkState": lambda: m.nvmlDeviceGetNvLinkState(h, 0),
        "nvmlDeviceGetNumaNodeId": lambda: m.nvmlDeviceGetNumaNodeId(h),
        "nvmlDeviceGetMigMode": lambda: m.nvmlDeviceGetMigMode(h),
        "nvmlDeviceGetPowerManagementLimit": lambda: m.nvmlDeviceGetPowerManagementLimit(h),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: m.nvmlDeviceGetEnforcedPowerLimit(h),
        "nvmlDeviceGetProcessUtilization":
            lambda: m.nvmlDeviceGetProcessUtilization(h, int((time.time() - 1) * 1e6)),
        "nvmlGpmQueryDeviceSupport": lambda: m.nvmlGpmQueryDeviceSupport(h),
    }
    wanted = [s for s in symbols if s in table] or list(table)
    out: dict[str, Any] = {"calls": calls, "field_values_fields": len(fields),
                           "not_timed": sorted(s for s in symbols if s not in table)}
    timings: dict[str, Any] = {}
    for name in wanted:
        took, error = [], None
        for _ in range(calls):
            start = time.perf_counter()
            try:
                table[name]()
            except m.NVMLError as exc:
                error = str(exc)
            except AttributeError as exc:  # a function the installed binding lacks
                error = f"not in this nvidia-ml-py ({exc})"
            took.append((time.perf_counter() - start) * 1e6)
        took.sort()
        timings[name] = {"p50_us": took[len(took) // 2],
                         "p90_us": took[min(len(took) - 1, int(0.9 * len(took)))],
                         "error": error}
    out["functions"] = timings
    return out


# --------------------------------------------------------------------------- the collector


def parse(body: str) -> list[tuple[str, dict[str, str], float]]:
    from testkit.exposition import parse_samples

    return parse_samples(body)


class Collector:
    """The real ``otel-gpu`` process, its port from its log line, its /metrics polled."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        from benchmarks.run import Server

        self.started = time.monotonic()
        self.server = Server([sys.executable, "-m", "otel_gpu", *args],
                             env={"PYTHONUNBUFFERED": "1", **(env or {})})

    def scrape(self, timeout: float = 10.0) -> tuple[int, str]:
        port = self.server.port
        if port is None:
            return 0, ""
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    def first_sample(self, deadline_s: float = 60.0) -> str:
        """Poll /metrics until it stops answering 503 ("no sample yet")."""
        deadline = time.monotonic() + deadline_s
        last = ""
        while time.monotonic() < deadline:
            if not self.server.alive():
                raise RuntimeError("otel-gpu exited:\n" + "\n".join(self.server.tail))
            try:
                status, body = self.scrape()
            except OSError as exc:
                status, body = 0, str(exc)
            if status == 200:
                return body
            last = f"{status} {body[:200]}"
            time.sleep(POLL)
        raise RuntimeError(f"no sample within {deadline_s:g} s (last answer: {last}):\n"
                           + "\n".join(self.server.tail))

    def fresh(self, after: float | None = None, deadline_s: float = 30.0,
              until: Callable[[str], bool] | None = None) -> tuple[str, float, float]:
        """The first body whose sample count moved past ``after`` (and meets ``until``):
        (body, its sample count, when it was scraped)."""
        deadline = time.monotonic() + deadline_s
        while True:
            status, body = self.scrape()
            samples = _one(parse(body), "otel_gpu_samples_total") if status == 200 else None
            if samples is not None and (after is None or samples > after) and (
                    until is None or until(body)):
                return body, samples, time.monotonic()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no fresh sample past {after} within {deadline_s:g} s")
            if not self.server.alive():
                raise RuntimeError("otel-gpu exited:\n" + "\n".join(self.server.tail))
            time.sleep(POLL)

    def stop(self) -> None:
        self.server.stop()


def _one(samples: list[tuple[str, dict[str, str], float]], name: str,
         **labels: str) -> float | None:
    found = [v for n, lab, v in samples
             if n == name and all(lab.get(k) == v for k, v in labels.items())]
    return found[0] if len(found) == 1 else None


# --------------------------------------------------------------------------- comparing


@dataclass
class Snapshot:
    """One scrape and the reference read right after it."""

    body: str
    samples: list[tuple[str, dict[str, str], float]]
    reference: dict[str, dict[str, Any]]
    gap: float
    count: float


def take(collector: Collector, reader: Reader, simulate: bool, after: float | None,
         gpm_window: float, until: Callable[[str], bool] | None = None) -> Snapshot:
    body, count, scraped = collector.fresh(after, until=until)
    samples = parse(body)
    ref = reader.ask("read", sample=int(count) if simulate else None, gpm_window=gpm_window)
    age = (_one(samples, "otel_gpu_sample_age_seconds") or 0.0) + (
        _one(samples, "otel_gpu_sample_duration_seconds") or 0.0)
    gap = age + (time.monotonic() - scraped) + GAP_SLACK
    return Snapshot(body, samples, ref["gpus"], gap, count)


def _value_text(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 6)
    return value


def compare_specs(phase: str, snap: Snapshot, specs: Iterable[Spec] = SPECS,
                  flags_move: bool = False) -> tuple[list[Row], set[tuple[str, tuple]]]:
    """Every spec on every GPU; returns the rows and the (family, labels) series used."""
    rows, used = [], set()
    index = _index(snap.samples)
    for uuid, ref in snap.reference.items():
        gpu = str(ref.get("index", "?"))
        for spec in specs:
            want = dict(spec.labels, hw_id=uuid)
            found = [(lab, v) for lab, v in index.get(spec.family, [])
                     if all(lab.get(k) == x for k, x in want.items())]
            for lab, _ in found:
                used.add((spec.family, tuple(sorted(lab.items()))))
            what = ",".join(v for _, v in spec.labels) or "-"
            value = ref.get(spec.key, "ERR:not read")
            tol = spec.tol
            if flags_move and spec.family == "nvidia_gpu_clock_throttle":
                tol = Tol("gauge", abs=1.0, text="0 or 1 (the reason moves under load)")
            if _refused(value):
                rows.append(Row(phase, spec.family, gpu, what, [v for _, v in found] or None,
                                value[4:], "absent: NVML refuses it", not found))
                continue
            reference = value * spec.scale
            if len(found) != 1:
                rows.append(Row(phase, spec.family, gpu, what,
                                None if not found else [v for _, v in found],
                                _value_text(reference), tol.describe(), False,
                                note="missing" if not found else "several series"))
                continue
            exported = found[0][1]
            rows.append(Row(phase, spec.family, gpu, what, _value_text(exported),
                            _value_text(reference), tol.describe(),
                            tol.ok(exported, reference, snap.gap)))
    return rows, used


def _index(samples: list[tuple[str, dict[str, str], float]]
           ) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, lab, value in samples:
        out.setdefault(name, []).append((lab, value))
    return out


def compare_custom(phase: str, snap: Snapshot, driver: str, interval: float,
                   collector_age: float) -> tuple[list[Row], set[tuple[str, tuple]]]:
    """The families no single reading gives: state, identity, the collector's own."""
    rows, used = [], set()
    index = _index(snap.samples)

    def mark(family: str, lab: dict[str, str]) -> None:
        used.add((family, tuple(sorted(lab.items()))))

    for uuid, ref in snap.reference.items():
        gpu = str(ref.get("index", "?"))
        states = {lab.get("hw_state"): v for lab, v in index.get("hw_status", [])
                  if lab.get("hw_id") == uuid}
        for lab, _ in index.get("hw_status", []):
            if lab.get("hw_id") == uuid:
                mark("hw_status", lab)
        on = sorted(s for s, v in states.items() if v == 1)
        rows.append(Row(phase, "hw_status", gpu, "state", on, ref["state"],
                        "the one state at 1", on == [ref["state"]]))
        infos = [lab for lab, _ in index.get("nvidia_gpu_info", []) if lab.get("hw_id") == uuid]
        for lab in infos:
            mark("nvidia_gpu_info", lab)
        info = infos[0] if len(infos) == 1 else {}
        expect = {"hw_model": ref.get("name"), "hw_name": ref.get("name"),
                  "hw_serial_number": ref.get("serial"),
                  "nvidia_gpu_pci_bus_id": ref.get("pci_bus_id"),
                  "nvidia_gpu_index": str(ref.get("index")), "hw_driver_version": driver,
                  "nvidia_gpu_numa_node": (None if _refused(ref.get("numa"))
                                           else str(ref.get("numa")))}
        for label, want in expect.items():
            if want is None or _refused(want):
                rows.append(Row(phase, "nvidia_gpu_info", gpu, label, info.get(label),
                                "refused by NVML", "not compared: NVML gives none", True,
                                note="sysfs or the kubelet may give it"))
                continue
            got = info.get(label)
            rows.append(Row(phase, "nvidia_gpu_info", gpu, label, got, want, "exact",
                            got == want))
    gpus = len(snap.reference)
    devices = {lab.get("hw_state"): v for lab, v in index.get("otel_gpu_devices", [])}
    for lab, _ in index.get("otel_gpu_devices", []):
        mark("otel_gpu_devices", lab)
    rows.append(Row(phase, "otel_gpu_devices", "-", "ok", devices.get("ok"), gpus,
                    "exact (no MIG)", devices.get("ok") == gpus, source="NVML count"))
    for lab, value in index.get("otel_gpu_device_sample_age_seconds", []):
        mark("otel_gpu_device_sample_age_seconds", lab)
        rows.append(Row(phase, "otel_gpu_device_sample_age_seconds",
                        lab.get("nvidia_gpu_index", "-"), "-", _value_text(value),
                        2 * interval, "at most", 0 <= value <= 2 * interval, source="interval"))
    for family, limit in (("otel_gpu_sample_age_seconds", 2 * interval),
                          ("otel_gpu_sample_duration_seconds", interval)):
        value = _one(snap.samples, family)
        used.add((family, ()))
        rows.append(Row(phase, family, "-", "-", _value_text(value), limit, "at most",
                        value is not None and 0 <= value <= limit, source="interval"))
    count = _one(snap.samples, "otel_gpu_samples_total")
    used.add(("otel_gpu_samples_total", ()))
    most = collector_age / interval + 2
    rows.append(Row(phase, "otel_gpu_samples_total", "-", "-", count, round(most, 1),
                    "1 .. age / interval + 2", count is not None and 1 <= count <= most,
                    source="interval"))
    rows += _energy_rows(phase, snap, index, used)
    return rows, used


def _energy_rows(phase: str, snap: Snapshot, index: dict, used: set) -> list[Row]:
    """Per GPU, the per-pod energy rows (the unattributed one included) sum to hw_energy."""
    rows = []
    for uuid, ref in snap.reference.items():
        parts = [(lab, v) for lab, v in index.get("nvidia_gpu_k8s_energy_joules_total", [])
                 if lab.get("hw_id") == uuid]
        if not parts:
            continue
        for lab, _ in parts:
            used.add(("nvidia_gpu_k8s_energy_joules_total", tuple(sorted(lab.items()))))
        total = [v for lab, v in index.get("hw_energy_joules_total", [])
                 if lab.get("hw_id") == uuid]
        got = sum(v for _, v in parts)
        want = total[0] if len(total) == 1 else None
        rows.append(Row(phase, "nvidia_gpu_k8s_energy_joules_total", str(ref.get("index")),
                        "sum of rows", round(got, 6), want, "= hw_energy (±1 mJ)",
                        want is not None and abs(got - want) <= 0.0015, source="consistency"))
    return rows


USAGE_SHARES = ("nvidia_gpu_k8s_sm_utilization", "nvidia_gpu_k8s_memory_controller_utilization",
                "nvidia_gpu_k8s_encoder_utilization", "nvidia_gpu_k8s_decoder_utilization")


def usage_rows(phase: str, snap: Snapshot, reader: Reader, simulate: bool, interval: float,
               held: str | None) -> tuple[list[Row], set[tuple[str, tuple]]]:
    """Per GPU, the per-pod usage rows (the unattributed one included) against NVML's
    processes: memory and process counts exact, the utilisation shares' sums within 0.3,
    and the energy rule of a GPU no pod holds."""
    rows, used = [], set()
    index = _index(snap.samples)
    at = int(snap.count) if simulate else None
    procs = reader.ask("procs", sample=at)
    for uuid, ref in snap.reference.items():
        gpu = str(ref.get("index"))
        listed = procs.get(uuid)
        if not isinstance(listed, list):
            continue
        shares = reader.ask("proc_util", sample=at, index=ref["index"],
                            seconds=max(2 * interval, 1.0))
        if "error_code" in shares:
            shares = {} if "Not Found" in shares["error_code"] else None
        for family, want, tol in (
                ("nvidia_gpu_k8s_memory_usage_bytes", sum(m or 0 for _, m in listed), EXACT),
                ("nvidia_gpu_k8s_processes", len(listed), EXACT),
                *((f, None if shares is None else sum(v[i] for v in shares.values()),
                   Tol("gauge", abs=0.3, text="sum ±0.3 (another window)"))
                  for i, f in enumerate(USAGE_SHARES))):
            found = [(lab, v) for lab, v in index.get(family, []) if lab.get("hw_id") == uuid]
            for lab, _ in found:
                used.add((family, tuple(sorted(lab.items()))))
            if want is None:
                rows.append(Row(phase, family, gpu, "sum of rows", len(found) or None,
                                "refused by NVML", "absent", not found))
                continue
            if not found and want == 0:
                continue  # no process, no row
            got = sum(v for _, v in found)
            rows.append(Row(phase, family, gpu, "sum of rows", _value_text(got),
                            _value_text(float(want)), tol.describe(),
                            tol.ok(got, float(want), snap.gap)))
        if uuid != held:  # processes of no pod: split by their shares when NVML gives them
            want_rule = "sm_share" if listed and shares is not None else "unattributed"
            rules = [lab.get("nvidia_gpu_energy_rule") for lab, v in
                     index.get("nvidia_gpu_k8s_energy_rule", []) if lab.get("hw_id") == uuid]
            for lab, _ in index.get("nvidia_gpu_k8s_energy_rule", []):
                if lab.get("hw_id") == uuid:
                    used.add(("nvidia_gpu_k8s_energy_rule", tuple(sorted(lab.items()))))
            rows.append(Row(phase, "nvidia_gpu_k8s_energy_rule", gpu, "rule", rules,
                            [want_rule], "no pod holds it", rules == [want_rule],
                            source="kubelet"))
    for family in ("otel_gpu_reader_failures_total",):
        for lab, value in index.get(family, []):
            used.add((family, tuple(sorted(lab.items()))))
            if value:
                rows.append(Row(phase, family, "-", lab.get("otel_gpu_reader", str(lab)), value,
                                0, "no reader failed", False, source="collector"))
    if held is None:
        for family, want in (("otel_gpu_kubelet_pods", 0), ("otel_gpu_kubelet_devices", 0),
                             ("otel_gpu_kubelet_unresolved_ids", 0)):
            got = _one(snap.samples, family)
            used.add((family, ()))
            rows.append(Row(phase, family, "-", "-", got, want, "exact", got == want,
                            source="kubelet"))
    age = _one(snap.samples, "otel_gpu_kubelet_mapping_age_seconds")
    if age is not None:
        used.add(("otel_gpu_kubelet_mapping_age_seconds", ()))
        rows.append(Row(phase, "otel_gpu_kubelet_mapping_age_seconds", "-", "-",
                        _value_text(age), 5.0, "at most (polled every 0.5 s)", 0 <= age <= 5,
                        source="kubelet"))
    return rows, used


def not_compared(samples: list[tuple[str, dict[str, str], float]],
                 used: set[tuple[str, tuple]]) -> dict[str, int]:
    """Series of each family the phase exported and compared with nothing."""
    out: dict[str, int] = {}
    for name, lab, _ in samples:
        if (name, tuple(sorted(lab.items()))) not in used:
            out[name] = out.get(name, 0) + 1
    return out


def compare_phase(result: Result, phase: str, collector: Collector, reader: Reader,
                  simulate: bool, interval: float, driver: str, gpm_window: float,
                  after: float | None = None, flags_move: bool = False,
                  extra: Callable[[Snapshot], tuple[list[Row], set]] | None = None,
                  until: Callable[[str], bool] | None = None,
                  held: str | None = None) -> Snapshot:
    """Compare a fresh sample; moving values that failed get one more try on the next."""
    snap = take(collector, reader, simulate, after, gpm_window, until)
    rows, used = compare_specs(phase, snap, flags_move=flags_move)
    custom, used2 = compare_custom(phase, snap, driver, interval,
                                   time.monotonic() - collector.started)
    rows += custom
    used |= used2
    more, used3 = usage_rows(phase, snap, reader, simulate, interval, held)
    rows += more
    used |= used3
    if extra is not None:
        more, used3 = extra(snap)
        rows += more
        used |= used3
    moving = {s.family for s in SPECS if s.tol.moving}
    retry = [r for r in rows if not r.ok and r.family in moving and r.source == "pynvml"]
    if retry:
        again = take(collector, reader, simulate, snap.count, gpm_window, until)
        second, _ = compare_specs(phase, again, flags_move=flags_move)
        by_key = {(r.family, r.device, r.what): r for r in second}
        for i, row in enumerate(rows):
            if row in retry:
                new = by_key.get((row.family, row.device, row.what))
                if new is not None:
                    new.note = f"second try (first: exported {row.exported}, " \
                               f"reference {row.reference})"
                    rows[i] = new
    result.add(*rows)
    result.not_compared[phase] = not_compared(snap.samples, used)
    failed = [r for r in rows if not r.ok]
    print(f"device-check: {phase}: {len(rows) - len(failed)} of {len(rows)} comparisons "
          f"passed, {sum(result.not_compared[phase].values())} series not compared",
          file=sys.stderr)
    return snap


# --------------------------------------------------------------------------- nvidia-smi


SMI = [  # (xpath under <gpu>, family, labels, scale to the exported unit, tolerance)
    ("fb_memory_usage/total", "hw_gpu_memory_limit_bytes", {}, MIB, Tol("gauge", abs=MIB)),
    ("fb_memory_usage/used", "hw_gpu_memory_usage_bytes", {}, MIB,
     Tol("gauge", abs=MEMORY.abs + MIB)),
    ("fb_memory_usage/reserved", "nvidia_gpu_memory_reserved_bytes", {}, MIB,
     Tol("gauge", abs=MIB)),
    ("temperature/gpu_temp", "hw_temperature_celsius", {"hw_sensor_location": "gpu"}, 1, TEMP),
    ("temperature/memory_temp", "hw_temperature_celsius", {"hw_sensor_location": "memory"}, 1,
     TEMP),
    ("gpu_power_readings/average_power_draw", "hw_power_watts", {}, 1, POWER),
    ("gpu_power_readings/power_draw", "hw_power_watts", {}, 1, POWER),
    ("gpu_power_readings/requested_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "current"}, 1, Tol("gauge", abs=0.01)),
    ("gpu_power_readings/current_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "enforced"}, 1, Tol("gauge", abs=0.01)),
    ("gpu_power_readings/default_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "default"}, 1, Tol("gauge", abs=0.01)),
    ("gpu_power_readings/min_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "min"}, 1, Tol("gauge", abs=0.01)),
    ("gpu_power_readings/max_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "max"}, 1, Tol("gauge", abs=0.01)),
    ("utilization/gpu_util", "hw_gpu_utilization", {"hw_gpu_task": "general"}, 0.01, UTIL),
    ("utilization/memory_util", "nvidia_gpu_memory_controller_utilization", {}, 0.01, UTIL),
    ("utilization/encoder_util", "hw_gpu_utilization", {"hw_gpu_task": "encoder"}, 0.01, UTIL),
    ("utilization/decoder_util", "hw_gpu_utilization", {"hw_gpu_task": "decoder"}, 0.01, UTIL),
    ("max_clocks/graphics_clock", "nvidia_gpu_clock_max_frequency_hertz",
     {"nvidia_gpu_clock_domain": "graphics"}, 1e6, EXACT),
    ("max_clocks/sm_clock", "nvidia_gpu_clock_max_frequency_hertz",
     {"nvidia_gpu_clock_domain": "sm"}, 1e6, EXACT),
    ("max_clocks/mem_clock", "nvidia_gpu_clock_max_frequency_hertz",
     {"nvidia_gpu_clock_domain": "memory"}, 1e6, EXACT),
    ("max_clocks/video_clock", "nvidia_gpu_clock_max_frequency_hertz",
     {"nvidia_gpu_clock_domain": "video"}, 1e6, EXACT),
    ("clocks/sm_clock", "nvidia_gpu_clock_frequency_hertz", {"nvidia_gpu_clock_domain": "sm"},
     1e6, CLOCK),
    ("clocks/mem_clock", "nvidia_gpu_clock_frequency_hertz",
     {"nvidia_gpu_clock_domain": "memory"}, 1e6, CLOCK),
    ("pci/pci_gpu_link_info/link_widths/max_link_width", "nvidia_gpu_pcie_link_max_width", {},
     1, EXACT),
    ("performance_state", "nvidia_gpu_performance_state", {}, 1, PSTATE),
]


def smi_values(xml_text: str) -> dict[str, dict[str, Any]]:
    """Per GPU UUID, the text nvidia-smi gives at each path of :data:`SMI`, and more."""
    root = ET.fromstring(xml_text)
    out = {"_driver": {"driver": (root.findtext("driver_version") or "").strip()}}
    for gpu in root.findall("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        values = {path: (gpu.findtext(path) or "").strip() for path, *_ in SMI}
        values["product_name"] = (gpu.findtext("product_name") or "").strip()
        values["serial"] = (gpu.findtext("serial") or "").strip()
        values["pci_bus_id"] = (gpu.findtext("pci/pci_bus_id") or "").strip()
        values["processes"] = [((p.findtext("pid") or "").strip(),
                                (p.findtext("used_memory") or "").strip())
                               for p in gpu.findall("processes/process_info")]
        out[uuid] = values
    return out


def _smi_number(text: str) -> float | None:
    if not text or "N/A" in text or "Not Supported" in text or "Unknown" in text:
        return None
    token = text.split()[0].lstrip("P").rstrip("x")
    try:
        return float(token)
    except ValueError:
        return None


def compare_smi(result: Result, phase: str, collector: Collector, gpus: dict[str, int]) -> None:
    """nvidia-smi -q -x where it reports the value otel-gpu exports (read right after a
    scrape, as the pynvml reference is)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        result.note(f"{phase}: nvidia-smi not found: its cross-check is skipped")
        return
    status, body = collector.scrape()
    started = time.monotonic()
    try:
        xml_text = subprocess.run([smi, "-q", "-x"], capture_output=True, text=True,
                                  timeout=60, check=True).stdout
        values = smi_values(xml_text)
    except (subprocess.SubprocessError, OSError, ET.ParseError) as exc:
        result.errors.append(f"{phase}: nvidia-smi -q -x failed: {exc}")
        return
    gap = time.monotonic() - started + 2.0
    index = _index(parse(body)) if status == 200 else {}
    rows = []
    for uuid, gpu in gpus.items():
        got = values.get(uuid)
        if got is None:
            rows.append(Row(phase, "nvidia-smi", str(gpu), "uuid", uuid, None, "listed", False,
                            source="nvidia-smi"))
            continue
        for path, family, labels, scale, tol in SMI:
            number = _smi_number(got[path])
            found = [v for lab, v in index.get(family, []) if lab.get("hw_id") == uuid
                     and all(lab.get(k) == x for k, x in labels.items())]
            if number is None:
                continue  # nvidia-smi does not report it here: nothing to cross-check
            want = number * scale
            ok = len(found) == 1 and tol.ok(found[0], want, gap)
            rows.append(Row(phase, family, str(gpu), f"{path}", found[0] if found else None,
                            want, tol.describe(), ok, source="nvidia-smi"))
        infos = [lab for lab, _ in index.get("nvidia_gpu_info", []) if lab.get("hw_id") == uuid]
        info = infos[0] if infos else {}
        for label, key in (("hw_model", "product_name"), ("hw_serial_number", "serial")):
            if got[key] and "N/A" not in got[key]:
                rows.append(Row(phase, "nvidia_gpu_info", str(gpu), label, info.get(label),
                                got[key], "exact", info.get(label) == got[key],
                                source="nvidia-smi"))
        if got["pci_bus_id"]:
            mine = (info.get("nvidia_gpu_pci_bus_id") or "").upper()
            rows.append(Row(phase, "nvidia_gpu_info", str(gpu), "nvidia_gpu_pci_bus_id", mine,
                            got["pci_bus_id"].upper(), "exact (case aside)",
                            mine == got["pci_bus_id"].upper(), source="nvidia-smi"))
    driver = values["_driver"]["driver"]
    versions = {lab.get("hw_driver_version") for lab, _ in index.get("nvidia_gpu_info", [])}
    rows.append(Row(phase, "nvidia_gpu_info", "-", "hw_driver_version", sorted(versions),
                    driver, "exact", versions == {driver}, source="nvidia-smi"))
    result.add(*rows)


# --------------------------------------------------------------------------- the load


LOAD_SOURCE = r"""
import sys, time
seconds, gib = float(sys.argv[1]), float(sys.argv[2])
try:
    import torch
    dev = torch.device("cuda:0")
    hold = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device=dev)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    step = lambda: torch.matmul(a, b)
    sync = torch.cuda.synchronize
    kind = "torch bf16"
except ImportError:
    import cupy
    hold = cupy.empty(int(gib * (1 << 30)), dtype=cupy.uint8)
    a = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32).astype(cupy.float16)
    b = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32).astype(cupy.float16)
    step = lambda: cupy.matmul(a, b)
    sync = cupy.cuda.runtime.deviceSynchronize
    kind = "cupy fp16"
step(); sync()
start = time.perf_counter(); n = 0
print("ready", kind, flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        step()
    sync(); n += 20
took = time.perf_counter() - start
print("done", n, 2 * 8192 ** 3 * n / took / 1e12, flush=True)
"""


def load_available() -> str | None:
    """What the load phase can use: torch, else cupy, else None."""
    for name in ("torch", "cupy"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


class Load:
    """One matmul child process holding ``gib`` GiB, for at most ``seconds``."""

    def __init__(self, seconds: float, gib: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LOAD_SOURCE, f"{seconds:g}",
                                      f"{gib:g}"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_ready(self, deadline_s: float = 90.0) -> str:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            for line in self.lines:
                if line.startswith("ready"):
                    return line[6:]
            if self.proc.poll() is not None:
                raise RuntimeError("the load exited:\n" + "\n".join(self.lines[-20:]))
            time.sleep(POLL)
        raise RuntimeError(f"the load was not running after {deadline_s:g} s")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        return "\n".join(self.lines[-3:])


def new_pid(reader: Reader, uuid: str, known: set[int], deadline_s: float = 30.0) -> int:
    """The pid NVML lists on ``uuid`` that is not in ``known`` (NVML's pid, whatever the
    check's namespace calls the process)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        procs = reader.ask("procs").get(uuid)
        if isinstance(procs, list):
            fresh = [pid for pid, _ in procs if pid not in known]
            if fresh:
                return int(fresh[0])
        time.sleep(POLL)
    raise RuntimeError(f"no new process on {uuid} within {deadline_s:g} s")


def load_rows(result: Result, idle: Snapshot, load: Snapshot, uuid: str) -> None:
    """Under load: utilisation, power and SM activity moved up from idle."""
    idle_ref, load_ref = idle.reference[uuid], load.reference[uuid]
    gpu = str(load_ref.get("index"))
    index_idle, index_load = _index(idle.samples), _index(load.samples)

    def exported(index: dict, family: str, **labels: str) -> float | None:
        found = [v for lab, v in index.get(family, []) if lab.get("hw_id") == uuid
                 and all(lab.get(k) == x for k, x in labels.items())]
        return found[0] if len(found) == 1 else None

    checks = [("hw_gpu_utilization", {"hw_gpu_task": "general"}, 0.5, "above 0.5 under load"),
              ("nvidia_gpu_sm_activity", {}, 0.5, "above 0.5 under load")]
    for family, labels, floor, rule in checks:
        got = exported(index_load, family, **labels)
        if got is None and family == "nvidia_gpu_sm_activity" and _refused(
                load_ref.get("gpm.sm", "ERR:")):
            continue  # no GPM on this GPU: compared as absent above
        result.add(Row("load", family, gpu, "moved", got, floor, rule,
                       got is not None and got > floor, source="load"))
    before = exported(index_idle, "hw_power_watts")
    after = exported(index_load, "hw_power_watts")
    result.add(Row("load", "hw_power_watts", gpu, "moved", after, before,
                   "20 W above idle", None not in (before, after) and after > before + 20,
                   source="load"))
    result.load["gpm_pynvml"] = {k: v for k, v in load_ref.items() if k.startswith("gpm.")}
    result.load["gpm_exported"] = {
        f: exported(index_load, f, **dict(lab)) for f, lab in (
            ("nvidia_gpu_sm_activity", ()), ("nvidia_gpu_graphics_activity", ()),
            ("nvidia_gpu_sm_occupancy", ()), ("nvidia_gpu_dram_activity", ()),
            ("nvidia_gpu_tensor_activity", (("nvidia_gpu_tensor_type", "any"),)),
            ("nvidia_gpu_tensor_activity", (("nvidia_gpu_tensor_type", "hmma"),)))}
    result.load["power_w"] = {"idle": before, "load": after}
    result.load["utilization"] = {"idle": exported(index_idle, "hw_gpu_utilization",
                                                   hw_gpu_task="general"),
                                  "load": exported(index_load, "hw_gpu_utilization",
                                                   hw_gpu_task="general")}
    del idle_ref


# --------------------------------------------------------------------------- pods

NAMESPACE = "device-check"


@dataclass
class PodPlan:
    name: str
    uid: str
    container_id: str
    pids: tuple[int, ...]
    device_id: str


def write_tree(root: Path, plans: list[PodPlan]) -> None:
    """The fake node's /proc cgroup files and kubelet log directories for ``plans``."""
    from otel_gpu.sim.node import write_node
    from otel_gpu.sim.scenario.model import ContainerSpec, NodeSpec, PodSpec

    pods = tuple(PodSpec(namespace=NAMESPACE, name=p.name, uid=p.uid, qos="burstable",
                         containers=(ContainerSpec(name="main", id=p.container_id,
                                                   pids=p.pids),))
                 for p in plans)
    write_node(NodeSpec(pods=pods), root)


def plan(name: str, pids: tuple[int, ...], device_id: str) -> PodPlan:
    seed = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"otel-gpu-device-check/{name}")
    return PodPlan(name, str(seed), (seed.hex * 2)[:64], pids, device_id)


def pod_rows(phase: str, snap: Snapshot, plans: list[PodPlan], uuid: str,
             procs: dict[int, int], shares: dict[str, float] | None
             ) -> tuple[list[Row], set[tuple[str, tuple]]]:
    """Labels, allocations, per-pod memory and processes, energy rule and kubelet counts."""
    rows, used = [], set()
    index = _index(snap.samples)
    gpu = str(snap.reference[uuid].get("index"))

    def mark(family: str, lab: dict[str, str]) -> None:
        used.add((family, tuple(sorted(lab.items()))))

    def key(lab: dict[str, str]) -> str | None:
        return lab.get("k8s_pod_name") or None

    exclusive = len(plans) == 1
    owner = [key(lab) for lab, _ in index.get("hw_gpu_memory_usage_bytes", [])
             if lab.get("hw_id") == uuid]
    want_owner = plans[0].name if exclusive else None
    rows.append(Row(phase, "hw_gpu_memory_usage_bytes", gpu, "k8s_pod_name label", owner,
                    [want_owner], "the pod holding it whole (none when shared)",
                    owner == [want_owner], source="kubelet"))
    if exclusive:
        uid = [lab.get("k8s_pod_uid") for lab, _ in index.get("hw_power_watts", [])
               if lab.get("hw_id") == uuid]
        rows.append(Row(phase, "hw_power_watts", gpu, "k8s_pod_uid label", uid, [plans[0].uid],
                        "the pod's UID from its log directory", uid == [plans[0].uid],
                        source="kubelet log directories"))
    allocs = {}
    for lab, value in index.get("nvidia_gpu_k8s_allocation", []):
        mark("nvidia_gpu_k8s_allocation", lab)
        if lab.get("hw_id") == uuid:
            allocs[key(lab)] = value
    rows.append(Row(phase, "nvidia_gpu_k8s_allocation", gpu, "pods", sorted(allocs),
                    sorted(p.name for p in plans), "one series at 1 per pod",
                    allocs == {p.name: 1.0 for p in plans}, source="kubelet"))
    memory, count, sm = {}, {}, {}
    for family, into in (("nvidia_gpu_k8s_memory_usage_bytes", memory),
                         ("nvidia_gpu_k8s_processes", count),
                         ("nvidia_gpu_k8s_sm_utilization", sm)):
        for lab, value in index.get(family, []):
            if lab.get("hw_id") == uuid:
                mark(family, lab)
                into[key(lab)] = value
    for p in plans:
        want = sum(procs.get(pid, 0) for pid in p.pids)
        rows.append(Row(phase, "nvidia_gpu_k8s_memory_usage_bytes", gpu, p.name,
                        memory.get(p.name), want, "exact: NVML's per-process memory, summed",
                        memory.get(p.name) == want))
        alive = sum(1 for pid in p.pids if pid in procs)
        rows.append(Row(phase, "nvidia_gpu_k8s_processes", gpu, p.name, count.get(p.name),
                        alive, "exact", count.get(p.name) == alive))
        if shares is not None:
            share = sum(shares.get(str(pid), [0.0])[0] for pid in p.pids)
            got = sm.get(p.name)
            rows.append(Row(phase, "nvidia_gpu_k8s_sm_utilization", gpu, p.name,
                            _value_text(got), round(share, 3), "±0.3 (another window)",
                            got is not None and abs(got - share) <= 0.3))
    rules = [lab.get("nvidia_gpu_energy_rule") for lab, v in
             index.get("nvidia_gpu_k8s_energy_rule", []) if lab.get("hw_id") == uuid and v == 1]
    for lab, _ in index.get("nvidia_gpu_k8s_energy_rule", []):
        mark("nvidia_gpu_k8s_energy_rule", lab)
    if exclusive:
        want_rules = ["exclusive"]
    elif shares is not None:  # NVML answers per-process shares (none: nothing ran)
        want_rules = ["sm_share"]
    else:
        want_rules = ["unattributed"]  # shared, and NVML gives no per-process shares
    rows.append(Row(phase, "nvidia_gpu_k8s_energy_rule", gpu, "rule", rules, want_rules,
                    "the rule the allocation implies", rules == want_rules, source="kubelet"))
    for family, want in (("otel_gpu_kubelet_pods", len(plans)), ("otel_gpu_kubelet_devices", 1),
                         ("otel_gpu_kubelet_unresolved_ids", 0)):
        got = _one(snap.samples, family)
        used.add((family, ()))
        rows.append(Row(phase, family, "-", "-", got, want, "exact", got == want,
                        source="kubelet"))
    allocated = {lab.get("nvidia_gpu_k8s_resource"): v
                 for lab, v in index.get("nvidia_gpu_k8s_allocated", [])}
    for lab, _ in index.get("nvidia_gpu_k8s_allocated", []):
        mark("nvidia_gpu_k8s_allocated", lab)
    rows.append(Row(phase, "nvidia_gpu_k8s_allocated", "-", "nvidia.com/gpu",
                    allocated.get("nvidia.com/gpu"), len(plans), "exact",
                    allocated.get("nvidia.com/gpu") == len(plans), source="kubelet"))
    return rows, used


def pods_ready(plans: list[PodPlan], uuid: str) -> Callable[[str], bool]:
    """A body where the collector has joined every pod: allocations and usage rows."""
    def ready(body: str) -> bool:
        index = _index(parse(body))
        allocs = {lab.get("k8s_pod_name") for lab, _ in index.get("nvidia_gpu_k8s_allocation", [])
                  if lab.get("hw_id") == uuid}
        # a pod the kubelet names has a zero row until its processes are mapped to it
        usage = {lab.get("k8s_pod_name") for lab, v in
                 index.get("nvidia_gpu_k8s_memory_usage_bytes", [])
                 if lab.get("hw_id") == uuid and v > 0}
        names = {p.name for p in plans}
        return names <= allocs and names <= usage and allocs <= names
    return ready


# --------------------------------------------------------------------------- cost


def measure_cost(kind: str, simulate: str | None, gpus: int, interval: float,
                 quiet_s: float, scrape_s: float, workdir: Path) -> dict[str, Any]:
    """One system's CPU per sample, CPU per gzip scrape, RSS and NVML calls per sample."""
    from benchmarks import peer
    from benchmarks.run import Server, rss_mib, scrape_for, value, window_cpu, window_seconds

    stamp = time.monotonic_ns()
    counts = workdir / f"{kind}-{stamp}.counts"
    port_file = workdir / f"{kind}-{stamp}.port"
    where = ["--scenario", simulate] if simulate else ["--real"]
    launch = [sys.executable, "-m", "benchmarks.launch"]
    if kind == "otel-gpu":
        args = ["serve", "--listen", "127.0.0.1:0", "--interval", f"{interval:g}",
                "--kubelet-socket", str(workdir / "no-kubelet.sock"), "--log-level", "info"]
        if simulate:
            args = ["--simulate", simulate, *args]
        argv = [*launch, "otel-gpu", "--counts-file", str(counts),
                *([] if simulate else ["--real"]), "--", *args]
        server = Server(argv)
        server.wait_ready("/readyz", 60)
    else:
        argv = [*launch, kind, *where, "--port-file", str(port_file), "--counts-file",
                str(counts), "--interval", f"{interval:g}"]
        server = Server(argv, port_file)
        server.wait_ready("/metrics", 90)
    try:
        port = server.port
        assert port is not None
        if kind == peer.NVITOP:  # it answers before its first sample: wait for every GPU
            deadline = time.monotonic() + 60
            while _family_gpus(_fetch(port), "gpu_utilization_Percentage") < gpus:
                if time.monotonic() > deadline or not server.alive():
                    raise RuntimeError(f"{kind} never served the {gpus} GPU(s)")
                time.sleep(POLL)
        counts_port = peer.counts_port(counts, server.alive)
        _fetch(port, gzip_=True)
        c0, cpu0 = peer.read_counts(counts_port), window_cpu(server.proc.pid)
        time.sleep(quiet_s)  # the measurement window: nobody scraping
        cpu = window_seconds(server.proc.pid, cpu0)
        c1 = peer.read_counts(counts_port)
        calls = peer.library_calls(c0, c1, gpus)
        samples = calls["samples"] if calls else 0
        per_sample = cpu / samples if samples else float("nan")
        cpu0 = window_cpu(server.proc.pid)
        c2 = peer.read_counts(counts_port)
        clients = scrape_for(port, scrape_s, 1, 0.0, None)
        cpu = window_seconds(server.proc.pid, cpu0)
        c3 = peer.read_counts(counts_port)
        scrapes = sum(len(c.scrapes) for c in clients)
        during = c3["samples"] - c2["samples"]
        per_scrape = (cpu - during * (per_sample if samples else 0.0)) / max(scrapes, 1)
        out = {
            "cpu_per_sample_ms": 1000 * per_sample,
            "cpu_per_gzip_scrape_ms": 1000 * per_scrape,
            "scrapes": scrapes,
            "scrape_errors": sum(c.errors for c in clients),
            "rss_mib": rss_mib(server.proc.pid),
            "nvml_calls_per_gpu_per_sample": calls["per_gpu_per_sample"] if calls else None,
            "nvml_missing_per_gpu_per_sample":
                calls["missing_per_gpu_per_sample"] if calls else None,
            "nvml_calls_by_symbol": calls["by_symbol"] if calls else {},
            "samples_measured": samples,
            "gzip_kb": len(_fetch(port, gzip_=True)) / 1000,
        }
        if kind == "otel-gpu":
            body = _fetch(port)
            out["self_reported_nvml_requests"] = value(body, "otel_gpu_nvml_requests_total")
            out["self_reported_samples"] = value(body, "otel_gpu_samples_total")
        return out
    finally:
        server.stop()


def _fetch(port: int, gzip_: bool = False) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gzip_ else {})
        resp = conn.getresponse()
        data = resp.read()
        return data if gzip_ or not resp.getheader("Content-Encoding") else gzip.decompress(data)
    finally:
        conn.close()


def _family_gpus(body: bytes, family: str) -> int:
    return len({lab.get("uuid") for name, lab, _ in parse(body.decode()) if name == family})


# --------------------------------------------------------------------------- the run


@dataclass
class Options:
    out: Path
    simulate: str | None
    reference: str | None
    interval: float
    load_seconds: float
    load_gib: float
    latency_calls: int
    quiet_seconds: float
    scrape_seconds: float
    systems: list[str]
    skip: set[str]


def run(opts: Options, argv: list[str]) -> Result:
    result = Result(started=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    mode=f"simulated ({opts.simulate})" if opts.simulate else "real driver",
                    command=["python", "-m", "benchmarks.device_check", *argv])
    began = time.monotonic()
    result.environment = {"python": platform.python_version(), "host": platform.node(),
                          "kernel": platform.release()}
    reader = Reader(opts.reference or opts.simulate)
    kubelet = collector = None
    loads: list[Load] = []
    tmp = Path(tempfile.mkdtemp(prefix="otel-gpu-check-", dir="/tmp"))
    try:
        hello = reader.ask("hello")
        driver = hello["driver"]
        result.environment.update(driver=driver, nvml=hello["nvml"], pynvml=hello["pynvml"],
                                  gpus=hello["gpus"])
        uuids = {g["uuid"]: g["index"] for g in hello["gpus"]}
        from testkit.kubelet import FakeKubelet

        kubelet = FakeKubelet().start()
        node = tmp / "node"
        write_tree(node, [])
        args = ["serve", "--listen", "127.0.0.1:0", "--interval", f"{opts.interval:g}",
                "--kubelet-socket", kubelet.socket_path, "--kubelet-interval", "0.5",
                "--process-usage", "true", "--proc-root", str(node / "proc"),
                "--pod-log-root", str(node / "var" / "log" / "pods")]
        if opts.simulate:
            args = ["--simulate", opts.simulate, *args]
        collector = Collector(args)
        collector.first_sample()
        sim = bool(opts.simulate)
        window = 0.05 if sim else 1.0

        def phase(name: str, **kw: Any) -> Snapshot:
            return compare_phase(result, name, collector, reader, sim, opts.interval, driver,
                                 window, **kw)

        idle = phase("idle")
        compare_smi(result, "idle", collector, uuids)
        target = next(iter(uuids))
        pids: list[int] = []
        engine = None if sim or "load" in opts.skip else load_available()
        if engine is None and not sim:
            result.note("load: neither torch nor cupy imports (or --skip load): "
                        "the load phase is skipped")
        if engine is not None:
            listed = reader.ask("procs").get(target)
            known = {pid for pid, _ in listed} if isinstance(listed, list) else set()
            loads.append(Load(opts.load_seconds, opts.load_gib))
            result.load["engine"] = loads[0].wait_ready()
            pids.append(new_pid(reader, target, known))
            _, busy, _ = collector.fresh(
                after=idle.count, deadline_s=60.0,
                until=lambda body: (_one(parse(body), "hw_gpu_utilization", hw_id=target,
                                         hw_gpu_task="general") or 0) > 0.5)
            # The GPM window of the first sample to show the load began before the load did
            # (0.39 SM activity on an H200 where the load held 0.96): the next one lies in it.
            loaded = phase("load", after=busy, flags_move=True)
            load_rows(result, idle, loaded, target)
            compare_smi(result, "load", collector, uuids)
        elif sim:
            procs = reader.ask("procs", sample=int(idle.count))
            target = next((u for u, p in procs.items() if isinstance(p, list) and len(p) >= 2),
                          target)
            pids = [pid for pid, _ in procs.get(target, [])][:2]
            result.note("load: simulated driver: no load phase; the pods phase places the "
                        f"scenario's processes {pids} on GPU {uuids[target]}")
        if "pods" in opts.skip:
            result.note("pods: skipped (--skip pods)")
        elif not pids:
            result.note("pods: no GPU process to place in a pod: the pods phase is skipped")
        else:
            run_pods(result, opts, collector, reader, kubelet, node, target, pids, loads, phase)
        for load in loads:
            result.load.setdefault("finished", []).append(load.stop())
        loads.clear()
        collector.stop()
        collector = None
        if "cost" in opts.skip:
            result.note("cost: skipped (--skip cost)")
        else:
            run_cost(result, opts, len(uuids), tmp)
        if "latency" in opts.skip:
            result.note("latency: skipped (--skip latency)")
        else:
            symbols = sorted((result.cost.get("otel-gpu") or {}).get("nvml_calls_by_symbol", {}))
            result.latency = reader.ask("latency", timeout=120, calls=opts.latency_calls,
                                        symbols=symbols)
    except Exception as exc:  # noqa: BLE001 - a phase's failure is the check's finding
        result.errors.append(f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    finally:
        for load in loads:
            load.stop()
        if collector is not None:
            collector.stop()
        if kubelet is not None:
            kubelet.close()
        reader.close()
        shutil.rmtree(tmp, ignore_errors=True)
    result.seconds = time.monotonic() - began
    return result


def run_pods(result: Result, opts: Options, collector: Collector, reader: Reader,
             kubelet: Any, node: Path, uuid: str, pids: list[int], loads: list[Load],
             phase: Callable[..., Snapshot]) -> None:
    """One pod holding the GPU whole, then two pods time-slicing it."""
    from testkit.kubelet import container, devices, pod

    sim = bool(opts.simulate)

    def apply(plans: list[PodPlan]) -> None:
        write_tree(node, plans)
        kubelet.set_pods([pod(p.name, container("main", devices("nvidia.com/gpu", p.device_id)),
                              namespace=NAMESPACE) for p in plans])

    def extra(plans: list[PodPlan], name: str) -> Callable[[Snapshot], tuple[list[Row], set]]:
        def rows(snap: Snapshot) -> tuple[list[Row], set]:
            at = int(snap.count) if sim else None
            procs = reader.ask("procs", sample=at).get(uuid)
            table = {int(pid): int(mem or 0) for pid, mem in procs} \
                if isinstance(procs, list) else {}
            shares = reader.ask("proc_util", sample=at, index=snap.reference[uuid]["index"],
                                seconds=max(2 * opts.interval, 1.0))
            if "error_code" in shares:  # NOT_FOUND: nothing ran since then, every share 0
                shares = {} if "Not Found" in shares["error_code"] else None
            return pod_rows(name, snap, plans, uuid, table, shares)
        return rows

    one = [plan("check-a", (pids[0],), uuid)]
    # a process never changes pods: every known one is placed in its final pod from the
    # start (the kubelet lists the second pod only in the time-sliced phase)
    write_tree(node, [*one, *([plan("check-b", (pids[1],), "")] if len(pids) > 1 else [])])
    kubelet.set_pods([pod(one[0].name, container("main", devices("nvidia.com/gpu", uuid)),
                          namespace=NAMESPACE)])
    moving = bool(loads)  # the throttle reasons move under load
    phase("pods-1", extra=extra(one, "pods-1"), until=pods_ready(one, uuid), held=uuid,
          flags_move=moving)
    if len(pids) < 2 and loads:
        known = set(pids)
        loads.append(Load(opts.load_seconds, opts.load_gib))
        loads[-1].wait_ready()
        pids.append(new_pid(reader, uuid, known))
    if len(pids) < 2:
        result.note("pods: one GPU process only: the time-sliced phase is skipped")
        return
    two = [plan("check-a", (pids[0],), f"{uuid}::0"), plan("check-b", (pids[1],), f"{uuid}::1")]
    apply(two)
    phase("pods-2", extra=extra(two, "pods-2"), until=pods_ready(two, uuid), held=uuid,
          flags_move=moving)


def run_cost(result: Result, opts: Options, gpus: int, tmp: Path) -> None:
    from benchmarks import peer

    for kind in opts.systems:
        if kind == peer.NVITOP and importlib.util.find_spec("nvitop_exporter") is None:
            result.note("cost: nvitop-exporter is not importable: skipped")
            continue
        try:
            result.cost[kind] = measure_cost(kind, opts.simulate, gpus, opts.interval,
                                             opts.quiet_seconds, opts.scrape_seconds, tmp)
        except Exception as exc:  # noqa: BLE001 - one system's failure is reported, not fatal
            result.cost[kind] = {"error": f"{type(exc).__name__}: {exc}"}
            result.note(f"cost: {kind} could not be measured: {exc}")


# --------------------------------------------------------------------------- the report


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return " ".join(text.split()).replace("|", "\\|")


def markdown(result: Result) -> str:
    env = result.environment
    gpus = env.get("gpus") or []
    names = sorted({g["name"] for g in gpus})
    lines = [
        "# otel-gpu device check",
        "",
        f"- **result**: {'PASS' if result.passed else 'FAIL'} "
        f"({len(result.rows) - len(result.failed)} of {len(result.rows)} comparisons passed"
        f"{', ' + str(len(result.errors)) + ' error(s)' if result.errors else ''})",
        f"- **GPU**: {len(gpus)} x {', '.join(names) or '?'}",
        f"- **driver**: {env.get('driver', '?')} (NVML {env.get('nvml', '?')}, "
        f"nvidia-ml-py {env.get('pynvml', '?')})",
        f"- **date**: {result.started}",
        f"- **mode**: {result.mode}; Python {env.get('python')}, host {env.get('host')}",
        f"- **command**: `{' '.join(result.command)}`",
        f"- **took**: {result.seconds:.0f} s",
        "",
    ]
    if result.errors:
        lines += ["## Errors", ""] + [f"- {e}" for e in result.errors] + [""]
    if result.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    phases = list(dict.fromkeys(r.phase for r in result.rows))
    lines += ["## Summary", "", "| phase | compared | passed | failed | series not compared |",
              "|---|---|---|---|---|"]
    for ph in phases:
        rows = [r for r in result.rows if r.phase == ph]
        bad = sum(1 for r in rows if not r.ok)
        nc = sum(result.not_compared.get(ph, {}).values())
        lines.append(f"| {ph} | {len(rows)} | {len(rows) - bad} | {bad} | {nc} |")
    lines.append("")
    if result.failed:
        lines += ["## Failed", "", "| phase | family | GPU | what | exported | reference | "
                  "rule | source | note |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [_row(r) for r in result.failed] + [""]
    lines += ["## Not compared", "",
              "Series exported that the check has no reference for, per phase and family.", ""]
    nc_any = False
    for ph, fams in result.not_compared.items():
        for fam, n in sorted(fams.items()):
            nc_any = True
            lines.append(f"- {ph}: `{fam}` ({n} series)")
    if not nc_any:
        lines.append("- none")
    lines.append("")
    if result.load:
        lines += ["## Load", "", "```json", json.dumps(result.load, indent=1, default=str), "```",
                  ""]
    if result.cost:
        lines += ["## Cost on this driver", "",
                  "| system | CPU per sample (ms) | CPU per gzip scrape (ms) | RSS (MiB) | "
                  "NVML calls per GPU per sample | gzip body (kB) |", "|---|---|---|---|---|---|"]
        for kind, c in result.cost.items():
            if "error" in c:
                lines.append(f"| {kind} | {_fmt(c['error'])} | | | | |")
                continue
            lines.append(f"| {kind} | {c['cpu_per_sample_ms']:.2f} | "
                         f"{c['cpu_per_gzip_scrape_ms']:.3f} | {c['rss_mib']:.1f} | "
                         f"{_fmt(c['nvml_calls_per_gpu_per_sample'])} | {c['gzip_kb']:.1f} |")
        lines.append("")
    functions = (result.latency or {}).get("functions") or {}
    if functions:
        lines += ["## NVML call latency", "",
                  f"{result.latency['calls']} calls each, on GPU 0; "
                  f"nvmlDeviceGetFieldValues with {result.latency['field_values_fields']} fields.",
                  "", "| function | p50 (us) | p90 (us) | error |", "|---|---|---|---|"]
        for name, t in sorted(functions.items(), key=lambda kv: -kv[1]["p50_us"]):
            lines.append(f"| {name} | {t['p50_us']:.1f} | {t['p90_us']:.1f} | "
                         f"{t['error'] or ''} |")
        if result.latency.get("not_timed"):
            lines.append("")
            lines.append("Called by the collector, not timed here: "
                         + ", ".join(result.latency["not_timed"]))
        lines.append("")
    lines += ["## Every comparison", "", "| phase | family | GPU | what | exported | reference | "
              "rule | source | note |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(r) for r in result.rows]
    return "\n".join(lines) + "\n"


def _row(r: Row) -> str:
    mark = "" if r.ok else "**FAIL** "
    return (f"| {r.phase} | {mark}`{r.family}` | {r.device} | {_fmt(r.what)} | "
            f"{_fmt(r.exported)} | {_fmt(r.reference)} | {r.rule} | {r.source} | {r.note} |")


def write(result: Result, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = asdict(result)
    data["passed"] = result.passed
    data["summary"] = {"compared": len(result.rows), "failed": len(result.failed),
                       "not_compared_series": {p: sum(f.values())
                                               for p, f in result.not_compared.items()}}
    js, md = out / "device-check.json", out / "device-check.md"
    js.write_text(json.dumps(data, indent=1, default=str))
    md.write_text(markdown(result))
    return js, md


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_reader"]:
        sub = argparse.ArgumentParser()
        sub.add_argument("--simulate")
        return reader_main(sub.parse_args(argv[1:]).simulate)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="directory for device-check.json and device-check.md")
    parser.add_argument("--simulate", metavar="PROFILE|FILE",
                        help="run against the simulator (the check's pynvml reads it too)")
    parser.add_argument("--reference-scenario", metavar="PROFILE|FILE",
                        help="simulation only: what the check's own pynvml reads (default: "
                             "--simulate); a different one must fail the check")
    parser.add_argument("--interval", type=float, default=1.0, help="the collector's interval")
    parser.add_argument("--load-seconds", type=float, default=150.0,
                        help="most seconds each load process runs (stopped when done)")
    parser.add_argument("--load-gib", type=float, default=4.0, help="GiB each load holds")
    parser.add_argument("--latency-calls", type=int, default=50)
    parser.add_argument("--quiet-seconds", type=float, default=6.0,
                        help="cost: the window of samples with nobody scraping")
    parser.add_argument("--scrape-seconds", type=float, default=2.0,
                        help="cost: the window of back-to-back gzip scrapes")
    parser.add_argument("--systems",
                        default="otel-gpu,handwritten,handwritten-same,nvitop-exporter",
                        help="cost: which systems, comma-separated")
    parser.add_argument("--skip", default="", help="comma-separated: load, pods, cost, latency")
    args = parser.parse_args(argv)
    if args.reference_scenario and not args.simulate:
        parser.error("--reference-scenario needs --simulate")
    if not 0.1 <= args.interval <= 10 or not 1 <= args.latency_calls <= 10_000:
        parser.error("--interval must be 0.1 to 10 s and --latency-calls 1 to 10000")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = skip - {"load", "pods", "cost", "latency"}
    if unknown:
        parser.error(f"--skip: unknown {', '.join(sorted(unknown))}")
    opts = Options(args.out, args.simulate, args.reference_scenario, args.interval,
                   args.load_seconds, args.load_gib, args.latency_calls, args.quiet_seconds,
                   args.scrape_seconds, [s for s in args.systems.split(",") if s], skip)
    result = run(opts, argv)
    js, md = write(result, args.out)
    print(f"device-check: {'PASS' if result.passed else 'FAIL'}: "
          f"{len(result.rows) - len(result.failed)} of {len(result.rows)} comparisons passed, "
          f"{len(result.errors)} error(s), "
          f"{sum(sum(f.values()) for f in result.not_compared.values())} series not compared; "
          f"{result.seconds:.0f} s; wrote {js} and {md}")
    for row in result.failed[:40]:
        print(f"  FAIL {row.phase} {row.family} gpu {row.device} {row.what}: exported "
              f"{row.exported}, reference {row.reference} ({row.rule}) {row.note}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
