"""The metric catalog: its rules, its conversions, and the generated docs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from otel_gpu import _docs
from otel_gpu.catalog import (
    CATALOG,
    MHZ,
    PERCENT,
    Kind,
    Metric,
    Point,
    all_sources,
    device_observations,
)
from otel_gpu.nvml.sources import MEM_TOTAL, MEM_USED, Reader, Source
from otel_gpu.snapshot import FAILED, OK
from tests.support.snapshots import sample

ROOT = Path(__file__).resolve().parents[1]
BY_NAME = {m.name: m for m in CATALOG}

# The DCGM_FI_DEV_* fields that dcgm-exporter's default-counters.csv enables (recent
# releases; the DCGM_FI_PROF_* fields it also enables need DCGM's profiling module, which
# NVML cannot stand in for), each with the catalog metric that carries the same reading.
DCGM_DEFAULTS = {
    "DCGM_FI_DEV_SM_CLOCK": "nvidia.gpu.clock.frequency",
    "DCGM_FI_DEV_MEM_CLOCK": "nvidia.gpu.clock.frequency",
    "DCGM_FI_DEV_MEMORY_TEMP": "hw.temperature",
    "DCGM_FI_DEV_GPU_TEMP": "hw.temperature",
    "DCGM_FI_DEV_POWER_USAGE": "hw.power",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "hw.energy",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "nvidia.gpu.pcie.replays",
    "DCGM_FI_DEV_GPU_UTIL": "hw.gpu.utilization",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "nvidia.gpu.memory_controller.utilization",
    "DCGM_FI_DEV_ENC_UTIL": "hw.gpu.utilization",
    "DCGM_FI_DEV_DEC_UTIL": "hw.gpu.utilization",
    "DCGM_FI_DEV_XID_ERRORS": "nvidia.gpu.xid.errors",
    "DCGM_FI_DEV_FB_FREE": "nvidia.gpu.memory.free",
    "DCGM_FI_DEV_FB_USED": "hw.gpu.memory.usage",
    "DCGM_FI_DEV_FB_RESERVED": "nvidia.gpu.memory.reserved",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "nvidia.gpu.nvlink.io",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "nvidia.gpu.memory.remapped_rows",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "nvidia.gpu.memory.remapped_rows",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "nvidia.gpu.memory.row_remap.failure",
    # DCGM_FI_DEV_VGPU_LICENSE_STATUS: only meaningful inside a vGPU guest; not exported.
}


def test_names_are_unique_and_namespaced():
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names))
    for name in names:
        assert name.split(".")[0] in {"hw", "nvidia", "otel_gpu"}, name


def test_every_row_has_a_value_source_and_docs():
    for m in CATALOG:
        assert bool(m.points) != bool(m.per_device or m.per_node), m.name
        assert m.description and m.unit, m.name
        assert m.describe_source(), m.name


def test_semantic_convention_kinds_and_units():
    expected = {
        "hw.gpu.utilization": (Kind.GAUGE, "1"),
        "hw.gpu.memory.usage": (Kind.UPDOWNCOUNTER, "By"),
        "hw.gpu.memory.limit": (Kind.UPDOWNCOUNTER, "By"),
        "hw.gpu.memory.utilization": (Kind.GAUGE, "1"),
        "hw.gpu.io": (Kind.COUNTER, "By"),
        "hw.errors": (Kind.COUNTER, "{error}"),
        "hw.status": (Kind.UPDOWNCOUNTER, "1"),
        "hw.power": (Kind.GAUGE, "W"),
        "hw.energy": (Kind.COUNTER, "J"),
        "hw.temperature": (Kind.GAUGE, "Cel"),
    }
    for name, (kind, unit) in expected.items():
        assert (BY_NAME[name].kind, BY_NAME[name].unit) == (kind, unit), name


def test_dcgm_default_fields_are_covered():
    for field_name, metric in DCGM_DEFAULTS.items():
        assert metric in BY_NAME, field_name


def test_kubernetes_deprecation_values_are_covered():
    # utilization, framebuffer used and free, GPU and memory temperature, power,
    # SM and memory clocks
    temps = {p.attributes["hw.sensor_location"] for p in BY_NAME["hw.temperature"].points}
    assert temps == {"gpu", "memory"}
    domains = {p.attributes["nvidia.gpu.clock.domain"]
               for p in BY_NAME["nvidia.gpu.clock.frequency"].points}
    assert {"sm", "memory"} <= domains
    tasks = {p.attributes["hw.gpu.task"] for p in BY_NAME["hw.gpu.utilization"].points}
    assert tasks == {"general", "encoder", "decoder"}


def test_sources_are_read_in_one_of_two_ways():
    sources = all_sources()
    assert len({s.key for s in sources}) == len(sources)
    for s in sources:
        assert (s.field_id is None) != (s.reader is None), s.key


def test_conversions():
    r = Reader("r", lambda m, h: {})
    values = {"util.gpu": 45.0, "memory.used": 25.0, "memory.total": 100.0, "clock.sm": 1980.0,
              "bits": 0b101}
    util = Source("util.gpu", "x", "%", reader=r)
    assert Point(util, conversion=PERCENT).value(values) == pytest.approx(0.45)
    assert Point(MEM_USED, per=MEM_TOTAL).value(values) == 0.25
    sm = Source("clock.sm", "x", "MHz", reader=r)
    assert Point(sm, conversion=MHZ).value(values) == 1.98e9
    bits = Source("bits", "x", "bitmask", reader=r)
    assert Point(bits, bit=0b100).value(values) == 1.0
    assert Point(bits, bit=0b010).value(values) == 0.0
    assert Point(Source("absent", "x", "1", reader=r)).value(values) is None
    assert Point(MEM_USED, per=MEM_TOTAL).value({"memory.used": 1.0, "memory.total": 0}) is None


def _sample(state=OK, **values):
    return sample(state=state, values=values)


def test_missing_values_are_omitted_not_zero():
    sample = _sample(**{"temp.gpu": 61.0})
    temps = device_observations(BY_NAME["hw.temperature"], sample)
    assert temps == [(61.0, {"hw.sensor_location": "gpu"})]
    assert device_observations(BY_NAME["nvidia.gpu.fan.speed"], sample) == []
    for m in CATALOG:
        for value, _ in device_observations(m, sample):
            assert math.isfinite(value)


def test_failed_device_keeps_only_status_xids_and_age():
    failed = sample(state=FAILED, values={"temp.gpu": 61.0}, xid_counts={79: 1, 13: 0},
                    age=0.5)
    kept = {}
    for m in CATALOG:
        points = device_observations(m, failed)
        if points:
            kept[m.name] = points
    assert set(kept) == {"hw.status", "nvidia.gpu.xid.errors", "otel_gpu.device.sample.age"}
    assert {a["hw.state"]: v for v, a in kept["hw.status"]} == {
        "ok": 0.0, "degraded": 0.0, "failed": 1.0, "predicted_failure": 0.0}
    assert sorted(kept["nvidia.gpu.xid.errors"], key=str) == sorted(
        [(0.0, {"nvidia.gpu.xid": "13"}), (1.0, {"nvidia.gpu.xid": "79"})], key=str)
    assert kept["otel_gpu.device.sample.age"] == [(0.5, {})]


def test_prometheus_names():
    assert _docs.prometheus_name(BY_NAME["hw.gpu.memory.usage"]) == "hw_gpu_memory_usage_bytes"
    assert _docs.prometheus_name(BY_NAME["hw.energy"]) == "hw_energy_joules_total"
    assert _docs.prometheus_name(BY_NAME["hw.temperature"]) == "hw_temperature_celsius"
    assert _docs.prometheus_name(BY_NAME["hw.errors"]) == "hw_errors_total"
    assert _docs.prometheus_name(BY_NAME["hw.gpu.io"]) == "hw_gpu_io_bytes_total"


def test_docs_are_up_to_date():
    on_disk = (ROOT / "docs" / "metrics.md").read_text()
    assert on_disk == _docs.markdown(), (
        "docs/metrics.md is stale: run `otel-gpu metrics --format markdown > docs/metrics.md`"
    )


def test_migration_guide_is_up_to_date():
    on_disk = (ROOT / "docs" / "migration.md").read_text()
    assert on_disk == _docs.migration(), (
        "docs/migration.md is stale: run `otel-gpu metrics --format migration > docs/migration.md`"
    )


# --- a new metric is one catalog entry plus one fake function ---------------------------

PSTATE = Source(
    "pstate", "nvmlDeviceGetPerformanceState", "1",
    reader=Reader("pstate", lambda m, h: {"pstate": m.nvmlDeviceGetPerformanceState(h)}),
)
TOY = Metric("test.gpu.performance_state", Kind.GAUGE, "1", "P-state, 0 (fastest) to 15.",
             points=(Point(PSTATE),))


def test_a_toy_metric_needs_one_entry_and_one_fake_function(fake_nvml):
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gpu import sim
    from otel_gpu.nvml.library import Nvml
    from otel_gpu.nvml.sampler import Sampler
    from otel_gpu.telemetry import build_meter_provider, build_resource

    class WithPState(sim.FakeNvml):  # the one fake function
        @sim.c_symbol
        def nvmlDeviceGetPerformanceState(self, handle, out):
            target, _ = self.check_device("nvmlDeviceGetPerformanceState", handle)
            sim.deref(out).value = 2 + target.gpu.index

    catalog = (*CATALOG, TOY)  # the one entry
    fake_nvml("t4", driver=WithPState)
    nvml = Nvml()
    nvml.init()
    snapshot = Sampler(nvml, catalog).sample()
    nvml.shutdown()
    reader = InMemoryMetricReader()
    provider = build_meter_provider(build_resource(environ={}), [reader],
                                    lambda: snapshot, catalog=catalog)
    points = {
        dict(p.attributes)["nvidia.gpu.index"]: p.value
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics for m in sm.metrics if m.name == TOY.name
        for p in m.data.data_points
    }
    provider.shutdown()
    assert points == {0: 2, 1: 3}
    assert "nvmlDeviceGetPerformanceState" not in sim.FakeNvml.c_symbols()  # test-only
    assert TOY not in CATALOG


def test_the_catalog_knows_no_driver_binding():
    """NVML specifics live under otel_gpu/nvml/; the catalog refers to their objects."""
    import ast

    import otel_gpu.catalog as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name and name.split(".")[0] == "pynvml" for name in imported)
    for source in all_sources():
        assert source.reader is None or callable(source.reader.read), source.key
