"""The benchmark's quick run, as a smoke test: its structure and its deterministic counts.

No timing is asserted here: timing goals live in the benchmark and docs/performance.md.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import yaml

from benchmarks import peer
from benchmarks import run as bench
from benchmarks.baselines import PROMCLIENT_KUBELET, series_file
from otel_gpu.sim.scenario import load_scenario
from testkit.scenarios import NODES, Node, scenario, write_scenario

pytestmark = pytest.mark.timeout(180)


def test_every_node_is_a_valid_scenario(tmp_path: Path) -> None:
    for node in NODES.values():
        path = tmp_path / f"{node.name}.yaml"
        path.write_text(yaml.safe_dump(scenario(node)))
        loaded = load_scenario(str(path))
        assert len(loaded.devices) == node.gpus
        assert sum(len(gpu.mig) for gpu in loaded.devices) == node.gpus * node.mig


def test_the_quick_run_measures_every_server_on_the_same_series(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert bench.main(["--quick", "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "### gpus-8" in out
    for _, _, label in bench.FIGURES:
        assert f"| {label} |" in out
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["meta"]["nodes"] == {"gpus-8": {"reps": 1, "interval": 0.5}}
    runs = written["results"]["gpus-8"]
    assert set(runs) == set(bench.KINDS) == {
        "otel-gpu", "handwritten", "promclient", peer.NVITOP, "static"}
    series = {kind: runs[kind][0]["cached"]["series"] for kind in bench.KINDS
              if kind != "handwritten"}
    assert series["otel-gpu"] == series["static"] == series["promclient"] > 700, series
    # the peer was measured on the simulated GPUs, every one of them
    assert runs[peer.NVITOP][0]["cached"]["peer_gpu_series"] == {
        family: 8 for family in peer.GPU_FAMILIES}
    for kind in bench.KINDS:
        cached, cycle = runs[kind][0]["cached"], runs[kind][0]["cycle"]
        assert cached["errors"] == cycle["errors"] == 0
        assert cached["scrapes"] > 0 and cycle["scrapes"] > 0
        for value in (cached["p50_ms"], cached["cpu_per_scrape_ms"], cached["rss_mib"],
                      cached["ready_s"]):
            assert math.isfinite(value) and value >= 0
    collector = runs["otel-gpu"][0]["cycle"]
    assert collector["after_sample_scrapes"] > 0  # samples were seen to move
    # h100x8's reads, per GPU and sample: deterministic, whatever the machine's speed
    assert collector["nvml_calls_per_gpu_per_sample"] == pytest.approx(EXPECTED_NVML_CALLS)
    # and the same counted where the calls reach the driver, for each system that reads it
    assert collector["nvml_library_calls_per_gpu_per_sample"] == pytest.approx(
        EXPECTED_LIBRARY_CALLS)
    assert collector["nvml_missing_per_gpu_per_sample"] == 0
    nvitop = runs[peer.NVITOP][0]["cycle"]
    assert nvitop["after_sample_scrapes"] > 0  # its samples were seen to move too
    assert nvitop["nvml_library_calls_per_gpu_per_sample"] > 0
    calls = nvitop["nvml_library_calls"]
    assert calls["samples"] > 0
    for symbol in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo_v2"):
        assert calls["by_symbol"][symbol] == 1.0  # every GPU, once per sample
    for kind in ("promclient", "static"):  # they hold captured series and read no NVML
        assert "nvml_library_calls_per_gpu_per_sample" not in runs[kind][0]["cycle"]
        assert "paced" not in runs[kind][0]
    # the hand-written exporter reads every GPU itself, and each system reading NVML was
    # measured with one gzip scrape per sample
    hand = runs["handwritten"][0]
    assert hand["cycle"]["nvml_library_calls"]["by_symbol"]["nvmlDeviceGetUtilizationRates"] \
        == 1.0
    for kind in ("otel-gpu", "handwritten", peer.NVITOP):
        paced = runs[kind][0]["paced"]
        assert paced["errors"] == 0 and paced["scrapes"] > 0 and paced["samples"] > 0
        assert math.isfinite(paced["cpu_per_interval_ms"]) and paced["cpu_per_interval_ms"] > 0


EXPECTED_NVML_CALLS = 17.5
"""Calls per GPU per sample in the h100x8 profile with the default settings: 17 per GPU
(one batched field call, the 14 values NVML has no field id for, GPM's two), and 2 per
sample for the node (the device count and the XID event wait), over 8 GPUs; 18.25 with
process usage on (tests/sample/test_batching.py). It was 28.25 before power, two power limits,
six violation times and the NVLink link states joined the batch and the row remap histogram
was read only when a remapping moves. Issue 13 asks for 14 at most: the rest have no field
id to batch them with."""

EXPECTED_LIBRARY_CALLS = 17.5
"""The same reads counted at the simulated library: 0.25 more than the collector's own
counter, because pynvml's compute process list calls the driver twice (size, then fill) on
the two GPUs that have processes, which the collector counts as one request each."""


def _peer_body(uuid: str, total_mib: float) -> bytes:
    labels = f'hostname="bench",index="0",uuid="{uuid}"'
    return "".join(f"{family}{{{labels}}} {total_mib}\n"
                   for family in peer.GPU_FAMILIES).encode()


def test_the_peer_check_counts_only_the_simulated_gpus(tmp_path: Path) -> None:
    path = write_scenario(NODES["gpus-8"], tmp_path)
    gpu = load_scenario(str(path)).devices[0]
    assert gpu.memory is not None
    total = gpu.memory.total / (1 << 20)
    assert peer.gpu_series(_peer_body(gpu.uuid, total), path) == {
        family: 1 for family in peer.GPU_FAMILIES}
    # a GPU the simulator does not have, or a value NaN: not counted
    assert set(peer.gpu_series(_peer_body("GPU-elsewhere", total), path).values()) == {0}
    assert set(peer.gpu_series(_peer_body(gpu.uuid, math.nan), path).values()) == {0}
    with pytest.raises(peer.PeerError, match="not the scenario's memory total"):
        peer.gpu_series(_peer_body(gpu.uuid, total + 1), path)


def test_a_peer_without_the_gpus_fails_the_run(tmp_path: Path) -> None:
    path = write_scenario(NODES["gpus-8"], tmp_path)
    with pytest.raises(peer.PeerError, match="never served all 8"):
        peer.wait_for_gpus(lambda: b"", path, 8, lambda: True, timeout=0.2)
    with pytest.raises(peer.PeerError, match="exited"):
        peer.wait_for_gpus(lambda: b"", path, 8, lambda: False)


def test_library_calls_are_per_gpu_per_whole_sample() -> None:
    first = {"samples": 2, "calls": {"a": 10, "b": 4}, "missing": {"x": 1}}
    last = {"samples": 6, "calls": {"a": 26, "b": 4, "c": 8}, "missing": {"x": 9}}
    got = peer.library_calls(first, last, gpus=2)
    assert got == {"per_gpu_per_sample": 3.0, "by_symbol": {"a": 2.0, "c": 1.0},
                   "missing_per_gpu_per_sample": 1.0, "missing": {"x": 1.0}, "samples": 4}
    assert peer.library_calls(last, last, gpus=2) is None


def test_series_file_keeps_every_labelled_series() -> None:
    body = ("# HELP a_total demo\n# TYPE a_total counter\na_total{x=\"1\"} 3.0\n"
            "a_total{x=\"2\",y=\"b\"} 4.0\n# HELP g demo\n# TYPE g gauge\ng 1.5\n")
    families = {f["name"]: f for f in series_file(body)}
    assert families["a"]["labels"] == ["x", "y"]
    assert families["a"]["samples"] == [[["1", ""], 3.0], [["2", "b"], 4.0]]
    assert families["g"]["samples"] == [[[], 1.5]]


def test_the_readers_benchmark_prints_a_row_per_node_with_its_ratios(capsys) -> None:
    from benchmarks import readers

    assert readers.main(["--configs", "gpus-8", "--rounds", "3"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| gpus-8 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(cells) == 6 and all(float(c.split()[0]) > 0 for c in cells[1:])


@pytest.mark.parametrize("module", ["readers", "render", "run", "cycle", "instructions",
                                    "paired"])
def test_an_unknown_node_is_one_usage_error_naming_it(module: str, capsys) -> None:
    import importlib

    main = importlib.import_module(f"benchmarks.{module}").main
    with pytest.raises(SystemExit) as stopped:
        main(["--configs", "gpus-8,gpus-9000"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown configuration(s): gpus-9000; known: gpus-1, gpus-8," in err


@pytest.mark.parametrize("system", ["otel-gpu", "handwritten", "handwritten-same", "sample",
                                    "collection", "field-batch"])
def test_each_system_the_instruction_count_runs_makes_its_cycles(system: str) -> None:
    """What runs under valgrind, run here without it: the system is built on the
    simulator and its cycles complete (valgrind itself is not in CI)."""
    from benchmarks import instructions

    assert instructions.run_cycles(system, "gpus-1", 2) == 2


def test_the_instruction_count_refuses_an_unknown_system(capsys) -> None:
    from benchmarks import instructions

    with pytest.raises(SystemExit) as stopped:
        instructions.main(["--systems", "otel-gpu,nope"])
    assert stopped.value.code == 2
    assert "unknown system(s): nope; known: otel-gpu," in capsys.readouterr().err


def _calls_of_one_sample(module, sample) -> Counter:
    """Each top-level NVML call one ``sample()`` makes through ``module``, with the
    arguments that say what it asks for (ints, field requests, GPM metric ids)."""
    made: Counter = Counter()
    inside = [False]
    real = {name: getattr(module, name) for name in dir(module)
            if name.startswith("nvml") and callable(getattr(module, name))}

    def spy(name: str, function):
        def call(*args, **kwargs):
            if inside[0]:  # pynvml calling itself (a versioned form): not the caller's call
                return function(*args, **kwargs)
            asked: list[object] = []
            for arg in args:
                if isinstance(arg, int):
                    asked.append(arg)
                elif isinstance(arg, list):
                    asked.append(tuple(sorted(tuple(entry) for entry in arg)))
                elif hasattr(arg, "numMetrics"):
                    asked.append(tuple(arg.metrics[i].metricId for i in range(arg.numMetrics)))
            made[(name, tuple(asked))] += 1
            inside[0] = True
            try:
                return function(*args, **kwargs)
            finally:
                inside[0] = False
        return call

    for name, function in real.items():
        setattr(module, name, spy(name, function))
    try:
        sample()
    finally:
        for name, function in real.items():
            setattr(module, name, function)
    return made


def test_the_same_reads_baseline_makes_the_collectors_nvml_calls(tmp_path: Path) -> None:
    """``handwritten-same`` is the baseline for what otel-gpu's own work costs only while
    it reads what otel-gpu reads: every call of a sample, with its arguments. Its reads
    derive from the catalog, so a new metric keeps the two equal without an edit."""
    import prometheus_client

    from benchmarks.cycle import built
    from benchmarks.handwritten import SameReads
    from otel_gpu import sim
    from otel_gpu.sample.sources import NVLINK_STATE

    with built("gpus-1") as (service, cycle):
        for _ in range(3):  # discovery, the first GPM sample: the steady state after
            cycle()
        ours = _calls_of_one_sample(service.nvml.module, service.sampler.sample)
    sim.install(sim.FakeNvml(load_scenario(str(write_scenario(NODES["gpus-1"], tmp_path)))))
    try:
        exporter = SameReads()
        for _ in range(3):
            exporter.sample()
        theirs = _calls_of_one_sample(exporter.nvml, exporter.sample)
        body = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    finally:
        exporter.nvml.nvmlShutdown()
        sim.uninstall()
    assert sum(ours.values()) >= 19 and any("FieldValues" in name for name, _ in ours)
    assert theirs == ours
    (gpu,) = exporter.gpus
    links = sum(field == NVLINK_STATE.field_id for field, _ in gpu.requests)
    lines = body.splitlines()  # and what it read is what it serves, a series a value
    assert links == 18  # an H100's, each link's state in the batch
    assert sum(ln.startswith("gpu_nvlink_state{") for ln in lines) == links
    assert sum(ln.startswith("gpu_gpm{") for ln in lines) == len(gpu.gpm_ids) > 0


def test_the_paired_run_measures_every_system_in_the_same_windows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import paired

    out = tmp_path / "paired.json"
    assert paired.main(["--systems", "otel-gpu,handwritten-same", "--windows", "2",
                        "--seconds", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())["results"]["gpus-1"]
    assert set(figures) == {"otel-gpu", "handwritten-same"}
    assert all(len(v) == 2 and all(math.isfinite(x) and x > 0 for x in v)
               for v in figures.values())
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| gpus-1 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["otel-gpu", "handwritten-same"]
    assert rows[0].rstrip().endswith("| - |") and not rows[1].rstrip().endswith("| - |")


@pytest.mark.parametrize("argv", [["--systems", "otel-gpu"], ["--systems", "otel-gpu,nope"],
                                  ["--windows", "0"], ["--seconds", "500"]])
def test_the_paired_run_refuses_what_it_cannot_compare(argv: list[str], capsys) -> None:
    from benchmarks import paired

    with pytest.raises(SystemExit) as stopped:
        paired.main(argv)
    assert stopped.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_the_baseline_asking_the_kubelet_polls_it_and_holds_the_collectors_series(
        tmp_path: Path) -> None:
    """On a node with pods the collector's RSS is held against a prometheus_client exporter
    that pays for gRPC too: it must ask the kubelet as the collector does, every second,
    and serve the same series as the plain one."""
    node = Node("pods-4", 2, pods=4, reps=1)
    harness = bench.Bench(tmp_path, bench.Settings(interval=1.0))
    try:
        harness.capture(node)  # the collector asked it too
        kubelet = harness.kubelets[node.name]
        asked = kubelet.calls["v1/List"]  # type: ignore[attr-defined]
        server = harness.start(PROMCLIENT_KUBELET, node, 1.0)[0]
        try:
            assert kubelet.wait_for_calls("v1/List", asked + 2)  # type: ignore[attr-defined]
            body = bench.fetch(server.port)  # type: ignore[arg-type]
            imported = Path(f"/proc/{server.proc.pid}/maps").read_text()
        finally:
            server.stop()
    finally:
        harness.close()
    assert bench.series_count(body, "nvidia_gpu_k8s_allocation") == 4
    assert "cygrpc" in imported
