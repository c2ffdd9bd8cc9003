"""The answer-shape matrix's cases, its unshaped baseline and its checks (the tests are
``tests/sample/test_answer_shapes.py``, whose docstring says what each case asserts)."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest

from otel_gpu import sim
from otel_gpu._clock import Clock
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.readers import (
    COMPUTE_PROCESSES,
    FABRIC_CLUSTER_KEYS,
    LINK_COUNT,
    NVLINK_STATES,
    Reader,
)
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sample.sources import (
    FABRIC_CLIQUE_ID,
    FABRIC_HEALTH_MASK,
    FABRIC_HEALTH_SUMMARY,
    FABRIC_STATE,
    FABRIC_STATUS,
    NVLINK_ACTIVE,
    Source,
)
from otel_gpu.sim.driver.shapes import Shape, Signature, error_names
from otel_gpu.snapshot import Snapshot
from tests.support.nvml import SOURCES

SCENARIO = """
name: shapes
devices:
  - name: NVIDIA H100 80GB HBM3          # GPU 0: a current driver, NVLink, GPM, busy processes
    numa_node: 0
    memory: {total: 85520809984, used: {start: 4000000000, step: 1000000}, reserved: 567279616}
    utilization: {gpu: {start: 10, step: 1}, memory: {start: 5, step: 1},
                  encoder: {start: 1, step: 1}, decoder: {start: 2, step: 1}}
    temperature: {start: 40, step: 1}
    power: {start: 100000, step: 1000}
    clocks: {graphics: {start: 1500, step: 3}, sm: {start: 1500, step: 3},
             memory: {start: 2600, step: 1}, video: {start: 1400, step: 2}}
    max_clocks: {graphics: 1980, sm: 1980, memory: 2619, video: 1755}
    clock_event_reasons: [1, 4, 0, 2]
    fan_speed: {start: 30, step: 1}
    performance_state: [0, 2, 0, 1]
    power_limits: {current: 700000, enforced: 690000, default: 700000, min: 200000,
                   max: 700000}
    pcie: {generation: 5, max_generation: 5, width: 16, max_width: 16}
    violations: {power: {start: 1000, step: 7}, thermal: {start: 2000, step: 7},
                 sync_boost: {start: 3000, step: 7}, board_limit: {start: 4000, step: 7},
                 low_utilization: {start: 5000, step: 7}, reliability: {start: 6000, step: 7}}
    row_remap_histogram: {max: 2559, high: 1}
    fields:
      TOTAL_ENERGY_CONSUMPTION: {start: 4000000000, step: 900000}
      MEMORY_TEMP: {start: 45, step: 1}
      PCIE_COUNT_TX_BYTES: {start: 600000000000, step: 2500000000}
      PCIE_COUNT_RX_BYTES: {start: 900000000000, step: 4000000000}
      PCIE_REPLAY_COUNTER: {start: 1, step: 1}
      ECC_SBE_VOL_TOTAL: {start: 1, step: 1}
      ECC_DBE_VOL_TOTAL: {start: 2, step: 1}
      ECC_SBE_AGG_TOTAL: {start: 10, step: 1}
      ECC_DBE_AGG_TOTAL: {start: 20, step: 1}
      REMAPPED_COR: {start: 3, step: 1}
      REMAPPED_UNC: {start: 4, step: 1}
      REMAPPED_PENDING: 0
      REMAPPED_FAILURE: 0
    gpm: {SM_UTIL: {start: 20, step: 1}, ANY_TENSOR_UTIL: {start: 10, step: 1},
          DRAM_BW_UTIL: {start: 30, step: 1}, PCIE_TX_PER_SEC: {start: 2000, step: 10}}
    nvlink:
      links:
        - {tx: {start: 1000000, step: 1000}, rx: {start: 2000000, step: 1000},
           crc_flit: {start: 1, step: 1}, replay: {start: 1, step: 1}}
        - {tx: {start: 3000000, step: 1000}, rx: {start: 4000000, step: 1000},
           crc_data: {start: 1, step: 1}, recovery: {start: 1, step: 1}}
    fabric: {clique_id: 3, cluster_uuid: 4c1d6a52-9b3e-4f0a-8c21-7e5d3b2a1f60}
    processes:
      - {pid: 4242, used_memory: {start: 1000000000, step: 1000}, sm: {start: 10, step: 1},
         memory_util: 5}
  - name: NVIDIA H100 80GB HBM3          # GPU 1: an older driver, every plain call in use
    numa_node: 1
    memory: {total: 85520809984, used: {start: 5000000000, step: 1000000}, reserved: 567279616}
    utilization: {gpu: {start: 20, step: 1}, memory: {start: 6, step: 1},
                  encoder: {start: 3, step: 1}, decoder: {start: 4, step: 1}}
    temperature: {start: 50, step: 1}
    power: {start: 200000, step: 1000}
    clocks: {graphics: {start: 1600, step: 3}, sm: {start: 1600, step: 3},
             memory: {start: 2610, step: 1}, video: {start: 1450, step: 2}}
    max_clocks: {graphics: 1980, sm: 1980, memory: 2619, video: 1755}
    clock_event_reasons: [4, 1, 0, 2]
    fan_speed: {start: 40, step: 1}
    performance_state: [2, 0, 1, 0]
    power_limits: {current: {start: 600000, step: 10}, enforced: {start: 590000, step: 10},
                   default: 700000, min: 200000, max: 700000}
    pcie: {generation: 4, max_generation: 5, width: 8, max_width: 16,
           tx_throughput: {start: 1200, step: 10}, rx_throughput: {start: 4500, step: 10}}
    violations: {power: {start: 1100, step: 7}, thermal: {start: 2100, step: 7},
                 sync_boost: {start: 3100, step: 7}, board_limit: {start: 4100, step: 7},
                 low_utilization: {start: 5100, step: 7}, reliability: {start: 6100, step: 7}}
    row_remap_histogram: {max: 2558, high: 2}
    fields:
      TOTAL_ENERGY_CONSUMPTION: {start: 5000000000, step: 900000}
      MEMORY_TEMP: {start: 55, step: 1}
      ECC_SBE_VOL_TOTAL: {start: 5, step: 1}
    unsupported: [POWER_AVERAGE, POWER_REQUESTED_LIMIT, POWER_CURRENT_LIMIT,
                  POWER_DEFAULT_LIMIT, POWER_MIN_LIMIT, POWER_MAX_LIMIT, PERF_POLICY_POWER,
                  PERF_POLICY_THERMAL, PERF_POLICY_SYNC_BOOST, PERF_POLICY_BOARD_LIMIT,
                  PERF_POLICY_LOW_UTILIZATION, PERF_POLICY_RELIABILITY]
    errors: {nvmlDeviceGetTemperatureV: FUNCTION_NOT_FOUND,
             nvmlDeviceGetMemoryInfo_v2: FUNCTION_NOT_FOUND,
             nvmlDeviceGetProcessesUtilizationInfo: FUNCTION_NOT_FOUND}
    processes:
      - {pid: 5151, used_memory: {start: 2000000000, step: 1000}, sm: {start: 30, step: 1},
         encoder: 2}
  - name: NVIDIA H100 80GB HBM3          # GPU 2: MIG, with GPM per instance
    numa_node: 1
    memory: {total: 85520809984, used: {start: 6000000000, step: 1000000}}
    temperature: {start: 60, step: 1}
    power: {start: 300000, step: 1000}
    clocks: {graphics: {start: 1700, step: 3}, sm: {start: 1700, step: 3},
             memory: {start: 2615, step: 1}, video: {start: 1500, step: 2}}
    fields:
      TOTAL_ENERGY_CONSUMPTION: {start: 6000000000, step: 900000}
      MEMORY_TEMP: {start: 65, step: 1}
    gpm: {SM_UTIL: {start: 40, step: 1}}
    mig:
      - profile: 3g.40gb
        gpu_instance_id: 1
        memory: {total: 42949672960, used: {start: 1000000000, step: 1000}}
        processes: [{pid: 6161, used_memory: {start: 500000000, step: 1000}}]
        gpm: {SM_UTIL: {start: 50, step: 1}}
      - profile: 1g.10gb
        gpu_instance_id: 9
        memory: {total: 10737418240, used: {start: 2000000000, step: 1000}}
        gpm: {SM_UTIL: {start: 60, step: 1}}
"""
"""Three GPUs that between them make every call the collector makes; every value moves
every sample (or cycles), so a value equal to the unshaped run's is this sample's."""

FABRIC_RAW = frozenset({s.key for s in (FABRIC_STATE, FABRIC_STATUS, FABRIC_CLIQUE_ID,
                                         FABRIC_HEALTH_MASK, FABRIC_HEALTH_SUMMARY)}
                       | set(FABRIC_CLUSTER_KEYS))
"""The fabric call's values no catalog row reads (the state, health and failure flags
derived from them are catalog sources)."""

SAMPLES = 3
"""Samples per case: the shape starts in the first sample that makes its call each sample
(the second; the first for calls made only at discovery or once per device)."""
READ_TIMEOUT = 1.0
"""The sampler's deadline per sample: a hung call costs each case this much per sample (at
0.3 s, a loaded two-core machine had healthy GPUs reported hung in the first sample)."""
SAMPLE_DEADLINE = READ_TIMEOUT * 4 + 5.0
"""How long ``sample()`` may take before the case fails as blocked."""
SLOW = 0.02
"""Seconds a slow call takes: slower than any real one, within the sampler's deadline."""
MANY = 4096
QUICK = 12
"""Cases of the rotating subset the quick loop runs in process."""
END_TO_END = 10
"""Cases of the rotating subset run against ``otel-gpu serve`` (two in the quick loop)."""
SEED = int(os.environ.get("ANSWER_SHAPES_SEED") or datetime.date.today().toordinal())
NOT_SAMPLED = frozenset({"nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString"})
"""Symbols left out: start-up and shutdown (a failure there is a start-up error, by design),
and the error string pynvml asks for while formatting an error (not a call that answers)."""


# --- what a normal run calls, and what each call gives --------------------------------------


@dataclass(frozen=True)
class Call:
    """One symbol as the collector uses it: where and when it is called, what it gives."""

    symbol: str
    gpu: int | None
    """The GPU the case shapes it on (None: a call about no GPU, shaped everywhere)."""
    start: int
    """The shape is in place from this sample on."""
    signature: Signature
    keys: frozenset[str]
    """The values that come from it (on every GPU for a call about none)."""
    at_close: bool = False
    """Made only when the sampler closes (a hang there holds no sample)."""


class _Seen(Shape):
    """Records each call's (sample, GPU), then answers as usual."""

    def __init__(self, seen: set[tuple[str, int, int | None]]) -> None:
        self.seen = seen

    def answer(self, symbol: Any, args: tuple[Any, ...]) -> Any:
        fake = symbol._fake
        self.seen.add((symbol.__name__, fake.sample, fake.gpu_of(symbol.__name__, args)))
        return symbol.answer(*args)


def new_sampler() -> Sampler:
    nvml = Nvml()
    nvml.init()
    return Sampler(nvml, SOURCES, process_usage=True, gpm_window=0.0,
                   read_timeout=READ_TIMEOUT, clock=Clock(sleep=lambda _: None))


def load_scenario() -> sim.Scenario:
    return sim.load_scenario(str(_scenario_file()))


def _scenario_file(shapes: str = "") -> Path:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"otel-gpu-shapes-{os.getpid()}.yaml"
    path.write_text(SCENARIO + shapes)
    return path


def _reader_symbols(lib: sim.FakeNvml, readers: list[Reader]) -> dict[str, set[Reader]]:
    """Symbol -> the readers that call it, on any GPU (each reader run on each handle)."""
    out: dict[str, set[Reader]] = {}
    pynvml.nvmlDeviceGetCount()
    for index in range(len(lib.scenario.devices)):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for reader in readers:
            before = dict(lib.calls)
            with contextlib.suppress(pynvml.NVMLError):
                reader.read(pynvml, handle)
            for symbol, n in lib.calls.items():
                if n > before.get(symbol, 0):
                    out.setdefault(symbol, set()).add(reader)
    return out


def _keys_by_symbol(lib: sim.FakeNvml) -> dict[str, frozenset[str]]:
    """Symbol -> the source keys whose value it gives: readers by what they call, the field
    call its fields (and the link states, which the batch gives where the driver answers
    them), the NVLink states the NVLink fields too, GPM's calls its metrics."""
    readers = list(dict.fromkeys(r for s in SOURCES for r in (s.reader, s.fallback)
                                 if r is not None))
    readers += [r for r in (COMPUTE_PROCESSES, NVLINK_STATES) if r not in readers]
    out: dict[str, set[str]] = {}
    for symbol, users in _reader_symbols(lib, readers).items():
        out[symbol] = {s.key for s in SOURCES if s.reader in users or s.fallback in users}
    # the link states' own values, which no catalog row reads but the events do
    states = {NVLINK_ACTIVE.key, LINK_COUNT}
    out.setdefault("nvmlDeviceGetFieldValues", set()).update(
        states, (s.key for s in SOURCES if s.field_id is not None
                 or s.reader is NVLINK_STATES))  # the batch answers the link states where it can
    out.setdefault("nvmlDeviceGetNvLinkState", set()).update(
        states, (s.key for s in SOURCES if s.nvlink is not None))
    # the fabric call's raw answer, which no catalog row reads but dcgm-exporter's fields,
    # nvidia.gpu.info and the events do
    out.setdefault("nvmlDeviceGetGpuFabricInfoV", set()).update(FABRIC_RAW)
    gpm = {s.key for s in SOURCES if s.gpm}
    for symbol in lib.c_symbols():
        if symbol.startswith("nvmlGpm"):
            out.setdefault(symbol, set()).update(gpm)
    return {symbol: frozenset(keys) for symbol, keys in out.items()}


@dataclass(frozen=True)
class Baseline:
    calls: tuple[Call, ...]
    values: tuple[dict[str, dict[str, float]], ...]
    """Per sample (index 0: sample 1), per device uuid, what the unshaped run publishes."""
    gpus: dict[str, int]
    """Device uuid -> its GPU's index (a MIG instance's parent's)."""


def _probe() -> Baseline:
    """One unshaped run: the calls it makes (when, on which GPU, with what outputs) and
    what it publishes in each sample."""
    lib = sim.FakeNvml(load_scenario(), sleep=lambda _: None)
    sim.install(lib)
    try:
        seen: set[tuple[str, int, int | None]] = set()
        for symbol in lib.c_symbols():
            lib.answer_shape(symbol, _Seen(seen))
        lib.record_signatures = {}
        sampler = new_sampler()
        snaps = [sampler.sample() for _ in range(SAMPLES)]
        sampled = {s for s, _, _ in seen}
        sampler.close()
        signatures = dict(lib.record_signatures)
        lib.clear_shapes()
        keys = _keys_by_symbol(lib)
    finally:
        sim.uninstall()
    values = tuple({d.device.uuid: dict(d.values) for d in snap.devices} for snap in snaps)
    gpus = {d.device.uuid: d.device.index for d in snaps[0].devices}
    calls = []
    for symbol in sorted({s for s, _, _ in seen} - NOT_SAMPLED):
        where = {(n, g) for s, n, g in seen if s == symbol}
        on = sorted({g for _, g in where if g is not None})
        gpu = on[0] if on else None
        if len(on) > 1 and 0 in on and 1 in on:
            gpu = 0
        start = 2 if any(n == 2 for n, g in where if g == gpu) else 1
        calls.append(Call(symbol, gpu, start, Signature.of(signatures[symbol]),
                          keys.get(symbol, frozenset()), at_close=symbol not in sampled))
    return Baseline(tuple(calls), values, gpus)


# --- the shapes each call gets ---------------------------------------------------------------


def highest(src: Source) -> int | None:
    """The largest integer ``src`` accepts, below the 32-bit "not available" value."""
    if not src.accepts(0):
        return None
    low, high = 0, 0xFFFFFFFF
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if src.accepts(mid) else (low, mid - 1)
    return low if low < 0xFFFFFFFE else None


def _bound_shapes(keys: frozenset[str]) -> list[str]:
    by_key = {s.key: s for s in SOURCES}
    out: list[str] = []
    for top in sorted({h for k in keys if k in by_key
                       and (h := highest(by_key[k])) is not None}):
        out += [f"value:{top}", f"value:{top + 1}", f"value:{top * 1000 + 1}"]
    return out


OPAQUE = frozenset({"nvmlGpmSampleGet", "nvmlGpmMigSampleGet"})
"""Calls that fill a buffer only the driver reads (a GPM sample): SUCCESS with nothing
written leaves the last sample in it, and no reader can tell, so that shape is left out
(docs/scenarios.md says so)."""


def shapes_for(call: Call) -> list[str]:
    sig = call.signature
    out = [f"returns:{name}" for name in error_names()
           if not (name == "SUCCESS" and call.symbol in OPAQUE)]
    if sig.is_list:
        out += ["entries:0", "entries:1", f"entries:{MANY}", "entries:over", "resized:1:1000",
                "resized:3:1"]
    if sig.numeric:
        out += ["all_ones", "saturated", "value:0", "value:1", f"value:{MANY}"]
        out += [s for s in _bound_shapes(call.keys) if s not in out]
    elif "pointer" in sig.kinds:
        out.append("all_ones")
    if sig.signed:
        out += ["value:-1", f"value:{-(2**31)}"]
    if sig.doubles:
        out += ["value:nan", "value:inf"]
    return [*out, "hang", f"slow:{SLOW}"]


BASELINE = _probe()
CASES = [(call, text) for call in BASELINE.calls for text in shapes_for(call)]
_PICKED = random.Random(SEED).sample(range(len(CASES)), min(len(CASES), QUICK + END_TO_END))
QUICK_CASES = frozenset(_PICKED[:QUICK])
E2E_CASES = [CASES[i] for i in _PICKED[QUICK:]]


def matrix_summary() -> str:
    """The line ``tests/sample/conftest.py`` prints after a run that included this file."""
    symbols = len(BASELINE.calls)
    return (f"answer-shape matrix: {len(CASES)} cases ({symbols} NVML calls x their shapes); "
            f"quick loop: {len(QUICK_CASES)} in process + 2 of {len(E2E_CASES)} end to end, "
            f"seed {SEED} (ANSWER_SHAPES_SEED to repeat)")


def _case_id(call: Call, text: str) -> str:
    return f"{call.symbol}@gpu{'*' if call.gpu is None else call.gpu}-{text}"


def params(cases: list[tuple[Call, str]], quick: Callable[[int], bool]) -> list[Any]:
    return [pytest.param(call, text, id=_case_id(call, text),
                         marks=() if quick(i) else (pytest.mark.slow,))
            for i, (call, text) in enumerate(cases)]


# --- running a case ----------------------------------------------------------------------------


class Tracebacks(logging.Handler):
    """Every record at INFO or above that carries a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


def bounded(run: Callable[[], Any], seconds: float,
             started: list[threading.Thread]) -> tuple[bool, Any]:
    """``run()`` on a thread of its own (added to ``started``): (whether it returned in
    time, its result or the exception it raised)."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(run())
        except BaseException as exc:  # noqa: BLE001 - reported by the case
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True, name="answer-shape-case")
    thread.start()
    started.append(thread)
    thread.join(seconds)
    return (not thread.is_alive(), out[0] if out else None)


def _explained(index: int, device: Any, snap: Snapshot) -> bool:
    """Whether the snapshot says why a GPU's values are missing: failed, hung, or named
    among the problems."""
    if device is not None and (device.error or device.hung):
        return True
    return any(re.search(rf"\bGPU {index}\b", e) for e in (*snap.errors, *snap.notes))


def check(call: Call, text: str, snaps: list[Snapshot]) -> list[str]:
    """What the snapshots get wrong (see the module doc)."""
    problems: list[str] = []
    sources = {s.key: s for s in SOURCES}
    kind, _, number = text.partition(":")
    injected = float(number) if kind == "value" else None  # may equal an earlier reading
    if text == "returns:SUCCESS":
        # SUCCESS with nothing written hands the binding's zeroed output on as the answer:
        # a 0 no collector can tell from a reading (P0, 0 C), not an earlier value reused
        injected = 0.0
    # The simulated driver's clock moves with the device count: with that call hung, the
    # driver answers the sample it reached for good, and so must the collector.
    stopped = text == "hang" and call.symbol.startswith("nvmlDeviceGetCount")
    for n, snap in enumerate(snaps, start=1):
        reached = min(n, call.start) if stopped else n
        expected = BASELINE.values[reached - 1]
        earlier = [BASELINE.values[m] for m in range(reached - 1)]
        by_uuid = {d.device.uuid: d for d in snap.devices}
        shaped_now = n >= call.start
        for uuid, want in expected.items():
            index = BASELINE.gpus[uuid]
            here = shaped_now and (call.gpu is None or call.gpu == index)
            gives = call.keys if here else frozenset()
            device = by_uuid.get(uuid)
            got = dict(device.values) if device is not None else {}
            where = f"sample {n}, GPU {index}" + ("" if device is None or not device.device.is_mig
                                                   else f" {device.device.mig_profile}")
            lost = sorted(set(want) - set(got) - gives)
            if lost and not (here and _explained(index, device, snap)):
                problems.append(f"{where}: {len(lost)} value(s) the shaped call does not give "
                                f"are missing: {', '.join(lost[:6])}")
            for key, value in got.items():
                src = sources.get(key)
                if src is not None and not src.accepts(value):
                    problems.append(f"{where}: {key} = {value!r} published, outside its bound")
                if key not in want or value == want[key]:
                    continue
                stale = [m + 1 for m, old in enumerate(earlier) if old.get(uuid, {}).get(key)
                         == value and value != injected]
                if key not in gives:
                    problems.append(f"{where}: {key} = {value!r}, expected {want[key]!r}"
                                    + (f" (sample {stale[-1]}'s value)" if stale else ""))
                elif stale:
                    problems.append(f"{where}: {key} = {value!r} is sample {stale[-1]}'s value, "
                                    "presented as new")
        if text == "hang" and shaped_now and call.gpu is not None and not call.at_close and not any(
                "has not returned" in e for e in snap.errors):
            problems.append(f"sample {n}: the hung call on GPU {call.gpu} is not among the "
                            f"snapshot's problems {list(snap.errors)}")
    return problems
