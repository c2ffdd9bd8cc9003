"""The metric catalog: its rules, its conversions, and the generated docs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from otel_gpu.export import _docs
from otel_gpu.instrument.catalog import CATALOG, all_sources
from otel_gpu.instrument.schema import MHZ, PERCENT, Kind, Metric, Point, device_observations
from otel_gpu.sample.readers import Reader
from otel_gpu.sample.sources import MEM_TOTAL, MEM_USED, Source
from otel_gpu.snapshot import FAILED, OK
from tests.support.snapshots import sample

ROOT = Path(__file__).resolve().parents[2]
BY_NAME = {m.name: m for m in CATALOG}

# The DCGM_FI_DEV_* fields that dcgm-exporter's default-counters.csv enables (recent
# releases; the DCGM_FI_PROF_* fields it also enables come from NVML GPM, see
# test_dcgm_profiling_fields_are_covered), each with the catalog metric that carries the
# same reading.
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


def test_sources_are_read_in_one_of_three_ways():
    sources = all_sources()
    assert len({s.key for s in sources}) == len(sources)
    for s in sources:
        assert (s.field_id is not None) + (s.reader is not None) + bool(s.gpm) == 1, s.key
    with pytest.raises(ValueError, match="exactly one of field_id, reader and gpm"):
        Source("both", "x", "%", field_id=1, gpm=(2,))
    with pytest.raises(ValueError, match="exactly one of field_id, reader and gpm"):
        Source("none", "x", "%")


# DCGM's profiling fields and the GPM-computed catalog rows carrying them.
DCGM_PROFILING = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("nvidia.gpu.graphics.activity", {}),
    "DCGM_FI_PROF_SM_ACTIVE": ("nvidia.gpu.sm.activity", {}),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("nvidia.gpu.sm.occupancy", {}),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("nvidia.gpu.tensor.activity",
                                        {"nvidia.gpu.tensor.type": "any"}),
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": ("nvidia.gpu.tensor.activity",
                                             {"nvidia.gpu.tensor.type": "hmma"}),
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE": ("nvidia.gpu.tensor.activity",
                                             {"nvidia.gpu.tensor.type": "imma"}),
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE": ("nvidia.gpu.tensor.activity",
                                             {"nvidia.gpu.tensor.type": "dfma"}),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("nvidia.gpu.pipe.activity", {"nvidia.gpu.pipe": "fp64"}),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("nvidia.gpu.pipe.activity", {"nvidia.gpu.pipe": "fp32"}),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("nvidia.gpu.pipe.activity", {"nvidia.gpu.pipe": "fp16"}),
    "DCGM_FI_PROF_PIPE_INT_ACTIVE": ("nvidia.gpu.pipe.activity",
                                     {"nvidia.gpu.pipe": "integer"}),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("nvidia.gpu.dram.activity", {}),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("nvidia.gpu.pcie.throughput",
                                   {"network.io.direction": "transmit"}),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("nvidia.gpu.pcie.throughput",
                                   {"network.io.direction": "receive"}),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvidia.gpu.nvlink.throughput",
                                     {"network.io.direction": "transmit"}),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvidia.gpu.nvlink.throughput",
                                     {"network.io.direction": "receive"}),
}


def test_dcgm_profiling_fields_are_covered():
    """Each DCGM profiling field has a GPM row documented with its DCGM name, in DCGM's
    unit once converted: a ratio 0..1 from GPM's percent, bytes/s from GPM's MiB/s."""
    for field_name, (metric_name, attributes) in DCGM_PROFILING.items():
        metric = BY_NAME[metric_name]
        point = next(p for p in metric.points if dict(p.attributes) == attributes)
        assert point.source.gpm and field_name in point.source.nvml, field_name
        assert metric.kind is Kind.GAUGE and field_name in metric.describe_source()
        raw = {point.source.key: 50.0}
        if metric.unit == "1":
            assert point.source.unit == "%" and point.value(raw) == 0.5, field_name
        else:
            assert metric.unit == "By/s" and point.source.unit == "MiB/s", field_name
            assert point.value(raw) == 50 * 2**20, field_name
    engines = {p.attributes["nvidia.gpu.engine"]: p.source.gpm
               for p in BY_NAME["nvidia.gpu.engine.utilization"].points}
    assert {k: len(v) for k, v in engines.items()} == {"nvdec": 8, "nvjpg": 8, "nvofa": 2}


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
    # its info series stays too: the identity a lost GPU keeps is joined from there
    assert set(kept) == {"hw.status", "nvidia.gpu.xid.errors", "otel_gpu.device.sample.age",
                         "nvidia.gpu.info"}
    assert kept["nvidia.gpu.info"] == [(1.0, {})]
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
    assert _docs.prometheus_name(BY_NAME["nvidia.gpu.info"]) == "nvidia_gpu_info"
    assert _docs.prometheus_name(BY_NAME["hw.gpu.io"]) == "hw_gpu_io_bytes_total"
    assert _docs.prometheus_name(BY_NAME["nvidia.gpu.pcie.throughput"]) == (
        "nvidia_gpu_pcie_throughput_bytes_per_second")


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

BOARD_ID = Source(
    "board_id", "nvmlDeviceGetBoardId", "1",
    reader=Reader("board_id", lambda m, h: {"board_id": m.nvmlDeviceGetBoardId(h)}),
)
TOY = Metric("test.gpu.board_id", Kind.GAUGE, "1", "Board id (GPUs on one board share it).",
             points=(Point(BOARD_ID),))


def test_a_toy_metric_needs_one_entry_and_one_fake_function(fake_nvml):
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gpu import sim
    from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
    from otel_gpu.sample.library import Nvml
    from otel_gpu.sample.sampler import Sampler
    from tests.support.drivers import WithBoardId

    catalog = (*CATALOG, TOY)  # the one entry
    fake_nvml("t4", driver=WithBoardId)  # the one fake function (tests/support/drivers.py)
    nvml = Nvml()
    nvml.init()
    snapshot = Sampler(nvml, all_sources(catalog)).sample()
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
    assert points == {0: 0, 1: 8}
    assert "nvmlDeviceGetBoardId" not in sim.FakeNvml.c_symbols()  # test-only
    assert TOY not in CATALOG


def test_the_catalog_knows_no_driver_binding():
    """NVML specifics live under otel_gpu/sample/; the catalog refers to their objects."""
    import ast

    for path in (Path(__file__).resolve().parents[2] / "otel_gpu" / "instrument").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not any(name and name.split(".")[0] == "pynvml" for name in imported), path
    for source in all_sources():
        assert source.reader is None or callable(source.reader.read), source.key


# --- power limits, P-state, PCIe link, throttle time, ECC history, NVLink health ------------

NEW_METRICS = {
    "nvidia.gpu.clock.max_frequency": (Kind.GAUGE, "Hz"),
    "nvidia.gpu.performance_state": (Kind.GAUGE, "1"),
    "nvidia.gpu.power.limit": (Kind.GAUGE, "W"),
    "nvidia.gpu.pcie.link.generation": (Kind.GAUGE, "1"),
    "nvidia.gpu.pcie.link.max_generation": (Kind.GAUGE, "1"),
    "nvidia.gpu.pcie.link.width": (Kind.GAUGE, "{lane}"),
    "nvidia.gpu.pcie.link.max_width": (Kind.GAUGE, "{lane}"),
    "nvidia.gpu.pcie.sampled_throughput": (Kind.GAUGE, "By/s"),
    "nvidia.gpu.nvlink.links": (Kind.UPDOWNCOUNTER, "{link}"),
    "nvidia.gpu.nvlink.errors": (Kind.COUNTER, "{error}"),
    "nvidia.gpu.clock.throttle_time": (Kind.COUNTER, "s"),
    "nvidia.gpu.memory.row_remap.banks": (Kind.UPDOWNCOUNTER, "{bank}"),
    "nvidia.gpu.memory.retired_pages": (Kind.COUNTER, "{page}"),
    "nvidia.gpu.memory.page_retirement.pending": (Kind.GAUGE, "1"),
    "nvidia.gpu.ecc.errors": (Kind.COUNTER, "{error}"),
}

READINGS = {
    "power.limit.current": 300000, "power.limit.enforced": 290000, "power.limit.default": 350000,
    "power.limit.min": 100000, "power.limit.max": 375000, "pstate": 8,
    "clock.video": 1500, "clock.max.sm": 2520, "clock.max.memory": 9001,
    "clock.max.graphics": 2505, "clock.max.video": 1965,
    "pcie.link.gen": 1, "pcie.link.gen.max": 4, "pcie.link.width": 8, "pcie.link.width.max": 16,
    "pcie.throughput.tx": 2000, "pcie.throughput.rx": 64000,
    "violation.power": 1_500_000_000, "violation.thermal": 250_000_000, "violation.sync_boost": 0,
    "violation.board_limit": 3, "violation.low_utilization": 40_000_000_000,
    "violation.reliability": 1_000,
    "remap.banks.max": 700, "remap.banks.high": 3, "remap.banks.partial": 2,
    "remap.banks.low": 1, "remap.banks.none": 0,
    "retired.sbe": 4, "retired.dbe": 1, "retired.pending": 1,
    "ecc.corrected": 2, "ecc.uncorrected": 0, "ecc.corrected.aggregate": 41,
    "ecc.uncorrected.aggregate": 5,
    "nvlink.links": 17, "nvlink.tx": 1953, "nvlink.rx": 2043, "nvlink.errors.crc_flit": 4,
    "nvlink.errors.crc_data": 1, "nvlink.errors.replay": 7, "nvlink.errors.recovery": 2,
}


def _observed(name: str, values=READINGS) -> dict[tuple, float]:
    return {tuple(sorted(attrs.items())): value
            for value, attrs in device_observations(BY_NAME[name], _sample(**values))}


def test_new_metric_kinds_and_units():
    for name, (kind, unit) in NEW_METRICS.items():
        assert (BY_NAME[name].kind, BY_NAME[name].unit) == (kind, unit), name


def test_new_metrics_convert_nvml_units():
    assert _observed("nvidia.gpu.power.limit") == {
        (("nvidia.gpu.power.limit.type", "current"),): 300.0,
        (("nvidia.gpu.power.limit.type", "enforced"),): 290.0,
        (("nvidia.gpu.power.limit.type", "default"),): 350.0,
        (("nvidia.gpu.power.limit.type", "min"),): 100.0,
        (("nvidia.gpu.power.limit.type", "max"),): 375.0,
    }
    assert _observed("nvidia.gpu.clock.max_frequency") == {
        (("nvidia.gpu.clock.domain", "sm"),): 2.52e9,
        (("nvidia.gpu.clock.domain", "memory"),): 9.001e9,
        (("nvidia.gpu.clock.domain", "graphics"),): 2.505e9,
        (("nvidia.gpu.clock.domain", "video"),): 1.965e9,
    }
    assert _observed("nvidia.gpu.clock.frequency") == {
        (("nvidia.gpu.clock.domain", "video"),): 1.5e9}
    throttle = _observed("nvidia.gpu.clock.throttle_time")
    assert throttle == pytest.approx({
        (("nvidia.gpu.throttle.reason", "power"),): 1.5,
        (("nvidia.gpu.throttle.reason", "thermal"),): 0.25,
        (("nvidia.gpu.throttle.reason", "sync_boost"),): 0.0,
        (("nvidia.gpu.throttle.reason", "board_limit"),): 3e-9,
        (("nvidia.gpu.throttle.reason", "low_utilization"),): 40.0,
        (("nvidia.gpu.throttle.reason", "reliability"),): 1e-6,
    }, rel=1e-12)
    assert _observed("nvidia.gpu.pcie.sampled_throughput") == {
        (("network.io.direction", "transmit"),): 2000 * 1024.0,
        (("network.io.direction", "receive"),): 64000 * 1024.0,
    }
    assert _observed("nvidia.gpu.pcie.link.generation") == {(): 1}
    assert _observed("nvidia.gpu.pcie.link.max_width") == {(): 16}
    assert _observed("nvidia.gpu.performance_state") == {(): 8}


def test_memory_health_metrics():
    assert _observed("nvidia.gpu.memory.row_remap.banks") == {
        (("nvidia.gpu.row_remap.availability", b),): v
        for b, v in (("max", 700), ("high", 3), ("partial", 2), ("low", 1), ("none", 0))}
    assert _observed("nvidia.gpu.memory.retired_pages") == {
        (("nvidia.gpu.page_retirement.cause", "multiple_single_bit_ecc"),): 4,
        (("nvidia.gpu.page_retirement.cause", "double_bit_ecc"),): 1,
    }
    assert _observed("nvidia.gpu.memory.page_retirement.pending") == {(): 1}
    ecc = _observed("nvidia.gpu.ecc.errors")
    assert ecc == {
        (("error.type", "corrected"), ("nvidia.gpu.ecc.counter_type", "volatile")): 2,
        (("error.type", "uncorrected"), ("nvidia.gpu.ecc.counter_type", "volatile")): 0,
        (("error.type", "corrected"), ("nvidia.gpu.ecc.counter_type", "aggregate")): 41,
        (("error.type", "uncorrected"), ("nvidia.gpu.ecc.counter_type", "aggregate")): 5,
    }
    # hw.errors keeps its volatile series as they were
    assert _observed("hw.errors") == {(("error.type", "corrected"),): 2,
                                      (("error.type", "uncorrected"),): 0}


def test_nvlink_metrics_and_their_absence():
    assert _observed("nvidia.gpu.nvlink.links") == {(): 17}
    assert _observed("nvidia.gpu.nvlink.errors") == {
        (("error.type", k),): v for k, v in (("crc_flit", 4), ("crc_data", 1), ("replay", 7),
                                             ("recovery", 2))}
    assert _observed("nvidia.gpu.nvlink.io") == {
        (("network.io.direction", "transmit"),): 1953 * 1024.0,
        (("network.io.direction", "receive"),): 2043 * 1024.0,
    }
    no_nvlink = {k: v for k, v in READINGS.items() if not k.startswith("nvlink.")}
    for name in ("nvidia.gpu.nvlink.links", "nvidia.gpu.nvlink.errors", "nvidia.gpu.nvlink.io"):
        assert _observed(name, no_nvlink) == {}, name


def test_nvlink_sources_are_fields_read_only_with_an_active_link():
    from otel_gpu.sample.sources import NVLINK_ERRORS, NVLINK_RX, NVLINK_TX, NvLink

    assert NVLINK_TX.nvlink is NVLINK_RX.nvlink is NvLink.LINKS
    assert {src.nvlink for _, src in NVLINK_ERRORS} == {NvLink.GPU}
    assert "UINT_MAX" in BY_NAME["nvidia.gpu.nvlink.io"].describe_source()
    with pytest.raises(ValueError, match="only a field can be an NVLink field"):
        Source("x", "x", "1", reader=Reader("r", lambda m, h: {}), nvlink=NvLink.GPU)
