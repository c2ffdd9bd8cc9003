"""Every answer shape on every NVML call the collector makes: one GPU's surprise stays there.

The cases are generated, not imagined. The calls are those a normal run on
:data:`SCENARIO` makes (counted by the fake driver); the shapes are every return
code pynvml defines, generated list entries (none, one, many, a count past the
buffer, a list resized between its two calls), replaced values (all ones,
saturated, 0, 1, many, each source's bound and just past it, far past it,
negatives and NaN where the C type holds them), a hang and a slow call, each
where the call's outputs can hold it (``shapes.Signature``). Each case puts one
shape on one call on one GPU of a three-GPU node and runs the real sampler, and
publishes each snapshot through the OpenTelemetry instruments and the Prometheus
text, checking:

* nothing escapes ``sample()`` or the render, no log line at INFO or above
  carries a traceback, and ``sample()`` returns within its deadline;
* every value of the other GPUs is published and equals what a run without the
  shape publishes in the same sample (each value here moves every sample, so an
  equal value is a fresh one); so is every value of the shaped GPU that the call
  does not give, unless the GPU failed or hung and the snapshot says so;
* a value the call gives is absent, or within its source's bound and not an
  earlier sample's value presented as this one's;
* a hung call shows as a hung GPU in the snapshot's problems.

The full matrix runs with the slow tests; the quick loop runs a rotating
subset (:data:`SEED`: the day's date, or ``ANSWER_SHAPES_SEED``), and so many
cases of it end to end against ``otel-gpu serve`` over HTTP. ``tests/sample/
conftest.py`` prints the matrix's size and the seed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from otel_gpu import sim
from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
from otel_gpu.sim.driver.shapes import error_names, parse_shape
from otel_gpu.snapshot import Snapshot
from testkit.exposition import new_reader, series
from testkit.process import wait_until
from tests.support.answer_shapes import (
    BASELINE,
    CASES,
    E2E_CASES,
    NOT_SAMPLED,
    OPAQUE,
    QUICK_CASES,
    SAMPLE_DEADLINE,
    SAMPLES,
    SCENARIO,
    SOURCES,
    Call,
    Tracebacks,
    bounded,
    check,
    highest,
    load_scenario,
    new_sampler,
    params,
    shapes_for,
)


@pytest.fixture
def shaped(fake_nvml) -> Iterator[Callable[[Call, str], tuple[list[Snapshot], list[str]]]]:
    """Runs one case: (the snapshots, the problems found); hung calls are released and
    the reader threads left idle before the driver is taken away."""
    state: dict[str, Any] = {}
    threads: list[threading.Thread] = []
    handler = Tracebacks()
    logging.getLogger().addHandler(handler)

    def run(call: Call, text: str) -> tuple[list[Snapshot], list[str]]:
        lib = state["lib"] = fake_nvml(load_scenario(), sleep=lambda _: None)
        lib.answer_shape(call.symbol, parse_shape(text), gpu=call.gpu, after=call.start - 1)
        problems: list[str] = []
        sampler = state["sampler"] = new_sampler()
        latest: list[Snapshot | None] = [None]
        reader, render = new_reader()
        state["provider"] = build_meter_provider(
            build_resource(environ={}), [reader], lambda: latest[0])
        snaps: list[Snapshot] = []
        for n in range(1, SAMPLES + 1):
            done, result = bounded(sampler.sample, SAMPLE_DEADLINE, threads)
            if not done:
                problems.append(f"sample {n}: sample() did not return within "
                                f"{SAMPLE_DEADLINE:.0f} s")
                break
            if isinstance(result, BaseException):
                problems.append(f"sample {n}: sample() raised {result!r}")
                break
            snaps.append(result)
            latest[0] = result
            done, body = bounded(render, SAMPLE_DEADLINE, threads)
            if not done or isinstance(body, BaseException) or not isinstance(body, bytes):
                problems.append(f"sample {n}: the render failed: {body!r}")
        problems += [f"a log line carries a traceback: {r.name}: {r.getMessage()}"
                     for r in handler.records]
        return snaps, problems

    yield run
    logging.getLogger().removeHandler(handler)
    lib = state.get("lib")
    if lib is not None:
        lib.release_hangs()
    for thread in threads:  # a sample blocked in a hung call ends before the driver goes
        thread.join(30.0)
    sampler = state.get("sampler")
    if sampler is not None:
        wait_until(lambda: not sampler.busy(), 30.0, "the reader threads to finish")
        sampler.close()
    if "provider" in state:
        state["provider"].shutdown()


@pytest.mark.reader_failures
@pytest.mark.parametrize(("call", "text"), params(CASES, lambda i: i in QUICK_CASES))
def test_one_call_answering_one_shape_costs_only_what_it_gives(shaped, call, text):
    snaps, problems = shaped(call, text)
    if not problems:
        problems = check(call, text, snaps)
    assert not problems, "\n".join(problems[:12])


def test_the_matrix_covers_every_call_a_sample_makes():
    """Derived from the run, not written down: the calls a sample makes, each with its shapes."""
    symbols = {c.symbol for c in BASELINE.calls}
    for expected in ("nvmlDeviceGetFieldValues", "nvmlDeviceGetProcessUtilization",
                     "nvmlDeviceGetProcessesUtilizationInfo", "nvmlGpmMigSampleGet",
                     "nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo",
                     "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetViolationStatus",
                     "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlEventSetWait_v2"):
        assert expected in symbols
    assert symbols <= sim.FakeNvml.c_symbols() - NOT_SAMPLED
    codes = len(error_names())
    assert all(sum(t.startswith("returns:") for c, t in CASES if c is call)
               == codes - (call.symbol in OPAQUE) for call in BASELINE.calls)
    lists = [c.symbol for c in BASELINE.calls if c.signature.is_list]
    assert sorted(lists) == ["nvmlDeviceGetComputeRunningProcesses_v3",
                             "nvmlDeviceGetProcessUtilization",
                             "nvmlDeviceGetProcessesUtilizationInfo"]
    # the temperature call the binding makes: nvidia-ml-py 12.x has only the unsigned one
    signed = hasattr(pynvml, "nvmlDeviceGetTemperatureV")
    temps = next(c for c in BASELINE.calls if c.symbol == (
        "nvmlDeviceGetTemperatureV" if signed else "nvmlDeviceGetTemperature"))
    top = highest(next(s for s in SOURCES if s.key == "temp.gpu"))
    assert top is not None and 100 < top < 1000  # the bound, found from the source alone
    assert {f"value:{top}", f"value:{top + 1}"} <= set(shapes_for(temps))
    assert ("value:-1" in shapes_for(temps)) == signed  # a negative where the type holds one


# --- end to end --------------------------------------------------------------------------------


def _yaml_shape(call: Call, text: str) -> str:
    """The case as the scenario's ``shapes`` key: on its GPU's entry, or at the top."""
    spec = f"{{function: {call.symbol}, shape: '{text}', after: {call.start - 1}}}"
    if call.gpu is None:
        return f"shapes: [{spec}]\n"
    return ""  # placed in the GPU's entry by _e2e_scenario


def _e2e_scenario(tmp_path: Path, call: Call, text: str) -> Path:
    spec = f"{{function: {call.symbol}, shape: '{text}', after: {call.start - 1}}}"
    lines = SCENARIO.splitlines(keepends=True)
    entries = [i for i, line in enumerate(lines) if line.startswith("  - name:")]
    if call.gpu is not None:
        lines.insert(entries[call.gpu] + 1, f"    shapes: [{spec}]\n")
    path = tmp_path / "shapes.yaml"
    path.write_text("".join(lines) + _yaml_shape(call, text))
    return path


@pytest.mark.reader_failures
@pytest.mark.parametrize(("call", "text"), params(E2E_CASES, lambda i: i < 2))
def test_the_collector_serves_the_other_gpus_through_a_shaped_call(collector, tmp_path, call,
                                                                   text):
    """The real process, over HTTP: it keeps serving, the other GPUs' series are there and
    fresh, and nothing is logged with a traceback."""
    proc = collector("--simulate", str(_e2e_scenario(tmp_path, call, text)),
                     "--process-usage", "true")
    first = proc.wait_sample(SAMPLES + 1, timeout=30.0)
    later = proc.wait_sample(SAMPLES + 3, timeout=30.0)
    assert proc.proc.poll() is None, "the collector exited"
    others = [uuid for uuid, index in BASELINE.gpus.items()
              if call.gpu is not None and index != call.gpu and uuid.startswith("GPU-")]
    for uuid in others:
        before = series(first, "hw_gpu_memory_usage_bytes", hw_id=uuid)
        after = series(later, "hw_gpu_memory_usage_bytes", hw_id=uuid)
        assert before and after, f"no memory series for {uuid}"
        assert before != after, f"{uuid}'s memory series did not move: not fresh"
    status, _, _ = proc.get("/readyz")
    assert status in (200, 503)
    assert "Traceback" not in proc.log
