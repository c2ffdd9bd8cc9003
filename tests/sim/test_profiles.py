"""The built-in profiles, played through pynvml: what each machine looks like."""

from __future__ import annotations

import pynvml
import pytest

from otel_gpu import sim
from otel_gpu.config import load
from otel_gpu.sim import builtin_profiles
from otel_gpu.sim.scenario import FABRIC_HEALTHY_MASK
from otel_gpu.wiring import Service, open_nvml
from testkit.exposition import series
from tests.sim.helpers import field, handles, next_sample, token
from tests.support.nvml import profile_uuids


def test_builtin_profiles_are_listed_sorted():
    assert builtin_profiles() == ["a100-mig", "demo", "gb200", "h100x8", "h200", "t4"]


@pytest.mark.parametrize(("profile", "count", "model"), [
    ("h100x8", 8, "NVIDIA H100 80GB HBM3"),
    ("a100-mig", 3, "NVIDIA A100-SXM4-40GB"),
    ("t4", 2, "Tesla T4"),
    ("gb200", 4, "NVIDIA GB200"),
])
def test_profile_loads_and_enumerates(nvml, profile, count, model):
    nvml(profile)
    assert pynvml.nvmlDeviceGetCount() == count
    hs = handles()
    assert [pynvml.nvmlDeviceGetName(h) for h in hs] == [model] * count
    uuids = [pynvml.nvmlDeviceGetUUID(h) for h in hs]
    assert len(set(uuids)) == count and all(u.startswith("GPU-") for u in uuids)
    bus_ids = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in hs]
    assert len(set(bus_ids)) == count
    assert [pynvml.nvmlDeviceGetIndex(h) for h in hs] == list(range(count))
    assert [pynvml.nvmlDeviceGetMinorNumber(h) for h in hs] == list(range(count))
    for i, uuid in enumerate(uuids):
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == i
    assert isinstance(pynvml.nvmlSystemGetDriverVersion(), str)
    assert len({token(h) for h in hs}) == count


def test_h100x8_has_distinct_readings_per_gpu(nvml):
    nvml("h100x8")
    next_sample()
    hs = handles()
    readings = {
        "temperature": [pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                        for h in hs],
        "power": [pynvml.nvmlDeviceGetPowerUsage(h) for h in hs],
        "memory.used": [pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used
                        for h in hs],
        "util.gpu": [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in hs],
        "clock.sm": [pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) for h in hs],
        "clock.graphics": [pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS)
                           for h in hs],
        "memory_temp": [field(h, "MEMORY_TEMP").value.ullVal for h in hs],
    }
    for name, values in readings.items():
        assert len(set(values)) == 8, (name, values)
    assert readings["temperature"] == [31, 33, 35, 37, 39, 41, 43, 45]
    mem = pynvml.nvmlDeviceGetMemoryInfo(hs[0], version=pynvml.nvmlMemory_v2)
    assert mem.total == 85520809984
    assert mem.free == mem.total - mem.used - mem.reserved


def test_h100x8_topology_fan_and_processes(nvml):
    nvml("h100x8")
    next_sample()
    hs = handles()
    assert [pynvml.nvmlDeviceGetNumaNodeId(h) for h in hs] == [0] * 4 + [1] * 4
    for h in hs:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetFanSpeed(h)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMigMode(h)
    pids = [sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)) for h in hs]
    assert pids == [[4242, 4243], [], [], [], [], [5151], [], []]


H100_COUNTERS = ("TOTAL_ENERGY_CONSUMPTION", "PCIE_COUNT_TX_BYTES", "PCIE_COUNT_RX_BYTES",
                 "NVLINK_THROUGHPUT_DATA_TX", "NVLINK_THROUGHPUT_DATA_RX",
                 "PCIE_REPLAY_COUNTER", "ECC_SBE_VOL_TOTAL")

def test_h100x8_counters_rise_with_samples(nvml):
    nvml("h100x8")
    ids = [getattr(pynvml, f"NVML_FI_DEV_{n}") for n in H100_COUNTERS]
    ids.append(pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL)
    series = []
    for _ in range(3):
        next_sample()
        entries = pynvml.nvmlDeviceGetFieldValues(pynvml.nvmlDeviceGetHandleByIndex(3), ids)
        assert all(e.nvmlReturn == pynvml.NVML_SUCCESS for e in entries)
        assert all(e.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG for e in entries)
        series.append([e.value.ullVal for e in entries])
    for i, name in enumerate(H100_COUNTERS):
        assert series[0][i] < series[1][i] < series[2][i], name
    assert [s[-1] for s in series] == [0, 0, 0]  # no double-bit errors, ever


def test_h100x8_remap_fields_supported(nvml):
    nvml("h100x8")
    next_sample()
    names = ["REMAPPED_COR", "REMAPPED_UNC", "REMAPPED_PENDING", "REMAPPED_FAILURE"]
    entries = pynvml.nvmlDeviceGetFieldValues(
        pynvml.nvmlDeviceGetHandleByIndex(2), [getattr(pynvml, f"NVML_FI_DEV_{n}") for n in names]
    )
    assert [e.nvmlReturn for e in entries] == [pynvml.NVML_SUCCESS] * 4
    assert [e.value.ullVal for e in entries] == [2, 0, 0, 0]


def test_t4_lacks_what_t4_lacks(nvml):
    nvml("t4")
    next_sample()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    missing = ["MEMORY_TEMP", "NVLINK_THROUGHPUT_DATA_TX", "NVLINK_THROUGHPUT_DATA_RX",
               "REMAPPED_COR", "REMAPPED_UNC", "REMAPPED_PENDING", "REMAPPED_FAILURE",
               "PCIE_COUNT_TX_BYTES", "PCIE_COUNT_RX_BYTES"]
    ids = [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    ids += [getattr(pynvml, f"NVML_FI_DEV_{n}") for n in missing]
    entries = pynvml.nvmlDeviceGetFieldValues(h, ids)
    assert entries[0].nvmlReturn == pynvml.NVML_SUCCESS and entries[0].value.ullVal > 0
    assert [e.nvmlReturn for e in entries[1:]] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * len(missing)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
    encoder, period = pynvml.nvmlDeviceGetEncoderUtilization(h)
    assert (encoder, period) == (5, 167000)
    assert pynvml.nvmlDeviceGetDecoderUtilization(pynvml.nvmlDeviceGetHandleByIndex(1))[0] == 32


def test_every_builtin_profile_is_named_where_users_choose_one():
    """The help text (and the README table made from it), the Helm schema, the sample
    config, the README's simulation paragraph and docs/scenarios.md name every built-in
    profile."""
    import json
    from pathlib import Path

    from otel_gpu.config.settings import Config, options_of

    root = Path(__file__).resolve().parents[2]
    help_text = next(o.help for o in options_of(Config) if o.key == "simulate")
    schema = json.loads((root / "deploy" / "helm" / "otel-gpu" / "values.schema.json").read_text())
    places = {"the simulate setting's help": help_text,
              "config/otel-gpu.yaml": (root / "config" / "otel-gpu.yaml").read_text(),
              "README.md": (root / "README.md").read_text(),
              "the Helm schema's simulate": schema["properties"]["config"]["properties"][
                  "simulate"]["description"],
              "docs/scenarios.md": (root / "docs" / "scenarios.md").read_text()}
    for where, text in places.items():
        for profile in builtin_profiles():
            assert profile in text, f"{where} does not name the built-in profile {profile}"


FABRIC_FIELDS = ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE",
                 "DCGM_FI_DEV_FABRIC_CLIQUE_ID", "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
                 "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY")
"""dcgm-exporter's NVLink fabric fields otel-gpu serves (docs/migration.md)."""


def test_gb200_shows_gpu_2_registering_with_the_nvlink_fabric(tmp_path):
    """``--simulate gb200``, opened as the CLI opens it and served as /metrics is: GPU 2's
    fabric registration is in progress at every sample, on the state series and on
    dcgm-exporter's fabric fields; GPUs 0, 1 and 3 completed theirs, healthy, in clique 7."""
    counters = tmp_path / "counters.csv"
    counters.write_text("".join(f"{name}, gauge, {name}.\n" for name in FABRIC_FIELDS))
    config = load({"simulate": "gb200", "listen": "127.0.0.1:0", "pod_attribution": "false",
                   "naming": "otel,dcgm", "collectors": str(counters)}, environ={})
    nvml = open_nvml(config.simulate)  # what `otel-gpu --simulate gb200` runs against
    bodies = []
    try:
        service = Service(config, nvml, environ={})
        try:
            nvml.init()
            for _ in range(4):
                service.pipeline.publish_sample(service.sampler.sample())
                bodies.append(service.server.cache.get().body.decode())
        finally:
            service.server.server_close()
            service.telemetry.shutdown(0.5)
            service.sampler.close()
            nvml.shutdown()
    finally:
        sim.uninstall()
    uuids = profile_uuids("gb200")
    registering = uuids[2]
    cluster = "4c1d6a52-9b3e-4f0a-8c21-7e5d3b2a1f60"
    for n, body in enumerate(bodies, 1):
        for uuid in uuids:
            expected = "in_progress" if uuid == registering else "completed"
            states = {labels["nvidia_gpu_fabric_state"]: value for labels, value
                      in series(body, "nvidia_gpu_fabric_state", hw_id=uuid)}
            assert states == {state: float(state == expected) for state in
                              ("not_started", "in_progress", "completed")}, (n, uuid)
            (info, _), = series(body, "nvidia_gpu_info", hw_id=uuid)
            # the driver gives no clique or cluster before the registration completes
            assert info.get("nvidia_gpu_fabric_clique_id", "") == (
                "" if uuid == registering else "7"), (n, uuid)
            assert info.get("nvidia_gpu_fabric_cluster_uuid", "") == (
                "" if uuid == registering else cluster), (n, uuid)
        for name in FABRIC_FIELDS:
            assert series(body, name), f"sample {n}: no {name}"
        status = {uuid: value for uuid in uuids
                  for _, value in series(body, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", UUID=uuid)}
        # dcgmFabricManagerStatus_t: 2 in progress, 3 success
        assert status == {uuid: 2 if uuid == registering else 3 for uuid in uuids}, n
        assert not series(body, "DCGM_FI_DEV_FABRIC_CLIQUE_ID", UUID=registering), n
        for uuid in uuids:
            if uuid != registering:
                assert series(body, "DCGM_FI_DEV_FABRIC_CLIQUE_ID", UUID=uuid)[0][1] == 7
                assert series(body, "DCGM_FI_DEV_FABRIC_HEALTH_MASK", UUID=uuid)[0][1] == (
                    FABRIC_HEALTHY_MASK)
                assert not series(body, "nvidia_gpu_fabric_registration_failed",
                                  hw_id=uuid)[0][1]
