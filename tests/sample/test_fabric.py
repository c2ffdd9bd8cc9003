"""NVLink fabric health on a simulated GB200 tray: the state series, the health series, the
clique and cluster on nvidia.gpu.info, dcgm-exporter's fabric fields and the events, from
the real sampler over the fake driver; and a GPU whose driver refuses the call has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_gpu.export.events import records as ev
from otel_gpu.export.events.detector import EventDetector
from otel_gpu.export.naming import ProfileOptions, build_profiles
from otel_gpu.export.naming.health import HealthProfile
from otel_gpu.instrument.attributes import HW_ID
from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.readers import fabric_health
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sim.scenario import FABRIC_HEALTHY_MASK, ScenarioError, load_scenario
from otel_gpu.snapshot import Snapshot
from testkit.exposition import new_reader, render_profiles, series
from tests.support.nvml import SOURCES

GB200 = Path(__file__).resolve().parents[1] / "sim" / "scenarios" / "gb200x4.yaml"
STATE = "nvidia_gpu_fabric_state"
FABRIC_FIELDS = ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE",
                 "DCGM_FI_DEV_FABRIC_CLIQUE_ID", "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
                 "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY")


@pytest.fixture
def tray(fake_nvml, tmp_path):
    """Samples the GB200 tray n times: (snapshots, OpenTelemetry text, dcgm text) per sample."""
    fake_nvml(str(GB200))
    counters = tmp_path / "counters.csv"
    counters.write_text("".join(f"{name}, gauge, {name}.\n" for name in FABRIC_FIELDS))
    dcgm = [p for p in build_profiles(["dcgm"], ProfileOptions(
        "h", collectors_file=str(counters))) if not isinstance(p, HealthProfile)]
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES)
    latest: list[Snapshot | None] = [None]
    reader, render = new_reader()
    provider = build_meter_provider(build_resource(environ={}), [reader], lambda: latest[0])

    def run(n: int) -> list[tuple[Snapshot, str, str]]:
        out = []
        for _ in range(n):
            latest[0] = snap = sampler.sample()
            out.append((snap, render().decode(), render_profiles(dcgm, snap).decode()))
        return out

    yield run
    provider.shutdown()
    sampler.close()
    nvml.shutdown()


def _uuid(snap: Snapshot, index: int) -> str:
    return next(s.device.uuid for s in snap.devices if s.device.index == index)


def _states(text: str, uuid: str) -> dict[str, float]:
    return {lab["nvidia_gpu_fabric_state"]: v for lab, v in series(text, STATE, hw_id=uuid)}


def test_registration_in_progress_shows_on_the_state_series_until_it_completes(tray):
    samples = tray(5)
    gpu2 = _uuid(samples[0][0], 2)
    for n, (_, text, _) in enumerate(samples, 1):
        expected = "in_progress" if n <= 3 else "completed"  # completed_after: 3
        assert _states(text, gpu2) == {
            name: float(name == expected) for name in ("not_started", "in_progress",
                                                       "completed")}, n
    first, last = samples[0][1], samples[-1][1]
    # the clique and cluster on the info series once registration completed, not before
    info = series(first, "nvidia_gpu_info", hw_id=gpu2)
    # (the text writes a label a family's other series have as empty: Prometheus's absent)
    assert len(info) == 1 and not info[0][0].get("nvidia_gpu_fabric_clique_id")
    info = series(last, "nvidia_gpu_info", hw_id=gpu2)
    assert info[0][0]["nvidia_gpu_fabric_clique_id"] == "7"
    assert info[0][0]["nvidia_gpu_fabric_cluster_uuid"] == "4c1d6a52-9b3e-4f0a-8c21-7e5d3b2a1f60"
    assert not series(first, "nvidia_gpu_fabric_registration_failed", hw_id=gpu2)
    assert series(last, "nvidia_gpu_fabric_registration_failed", hw_id=gpu2)[0][1] == 0


def test_the_dcgm_names_follow_the_registration(tray):
    samples = tray(4)
    gpu2, gpu3 = _uuid(samples[0][0], 2), _uuid(samples[0][0], 3)
    status = [series(dcgm, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", UUID=gpu2)
              for _, _, dcgm in samples]
    assert [s[0][1] for s in status] == [2, 2, 2, 3]  # in progress, then success
    first, last = samples[0][2], samples[-1][2]
    assert not series(first, "DCGM_FI_DEV_FABRIC_CLIQUE_ID", UUID=gpu2)
    assert series(last, "DCGM_FI_DEV_FABRIC_CLIQUE_ID", UUID=gpu2)[0][1] == 7
    assert series(last, "DCGM_FI_DEV_FABRIC_HEALTH_MASK", UUID=gpu2)[0][1] == FABRIC_HEALTHY_MASK
    # GPU 3 completed with NVML_ERROR_TIMEOUT, bandwidth degraded, limited capacity
    assert series(last, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", UUID=gpu3)[0][1] == 4
    assert series(last, "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE", UUID=gpu3)[0][1] == 10
    assert series(last, "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", UUID=gpu3)[0][1] == 3


def test_the_health_mask_conditions_are_their_own_series(tray):
    (snap, text, _), = tray(1)
    gpu0, gpu3 = _uuid(snap, 0), _uuid(snap, 3)
    health = {lab["nvidia_gpu_fabric_health_condition"]: v
              for lab, v in series(text, "nvidia_gpu_fabric_health", hw_id=gpu3)}
    assert health == {"degraded_bandwidth": 1, "route_recovery": 0, "route_unhealthy": 0,
                      "access_timeout_recovery": 0, "incorrect_configuration": 0,
                      "partition_unassigned": 0, "fabric_manager_disconnected": 1}
    assert {v for _, v in series(text, "nvidia_gpu_fabric_health", hw_id=gpu0)} == {0}
    assert series(text, "nvidia_gpu_fabric_registration_failed", hw_id=gpu3)[0][1] == 1


def test_a_gpu_whose_driver_refuses_the_call_has_no_fabric_series(tray):
    samples = tray(2)
    h200 = _uuid(samples[0][0], 4)
    for snap, text, dcgm in samples:
        assert not [k for k in next(s for s in snap.devices if s.device.uuid == h200).values
                    if k.startswith("fabric")]
        for name in (STATE, "nvidia_gpu_fabric_health", "nvidia_gpu_fabric_registration_failed"):
            assert not series(text, name, hw_id=h200), name
            assert series(text, name), f"{name}: the GB200s have it"
        assert not series(text, "nvidia_gpu_info", hw_id=h200)[0][0].get(
            "nvidia_gpu_fabric_clique_id")
        for name in FABRIC_FIELDS:
            assert not series(dcgm, name, UUID=h200), name


def test_the_registration_and_health_events(tray):
    detector = EventDetector()
    samples = tray(7)
    snap0 = samples[0][0]
    gpu2, gpu3 = _uuid(snap0, 2), _uuid(snap0, 3)
    events = [(n, e) for n, (snap, _, _) in enumerate(samples, 1)
              for e in detector.observe(snap)]
    fabric = [(n, e.name, e.attributes[HW_ID], e.attributes.get(ev.EVENT_PHASE))
              for n, e in events if e.name.startswith("nvidia.gpu.fabric")]
    assert fabric == [
        (1, "nvidia.gpu.fabric.registration", gpu2, "start"),
        (1, "nvidia.gpu.fabric.registration", gpu3, "start"),
        (2, "nvidia.gpu.fabric.health.degraded_bandwidth", gpu3, "start"),
        (2, "nvidia.gpu.fabric.health.fabric_manager_disconnected", gpu3, "start"),
        (5, "nvidia.gpu.fabric.registration", gpu2, "end"),  # completed at 4, held 2
    ]
    start = next(e for _, e in events if e.name == "nvidia.gpu.fabric.registration"
                 and e.attributes[HW_ID] == gpu2)
    assert start.severity == ev.ERROR and "in progress" in start.body
    assert start.attributes[ev.FABRIC_STATE_ATTR] == "in_progress"
    failed = next(e for _, e in events if e.name == "nvidia.gpu.fabric.registration"
                  and e.attributes[HW_ID] == gpu3)
    assert failed.attributes[ev.FABRIC_STATUS_ATTR] == 10 and "error 10" in failed.body
    end = next(e for _, e in events if e.attributes.get(ev.EVENT_PHASE) == "end")
    assert end.severity == ev.INFO and "joined its NVLink domain (clique 7)" in end.body


def test_an_older_driver_without_the_versioned_structures_still_gives_the_state(fake_nvml):
    fake_nvml("""
devices:
  - name: NVIDIA GH200 480GB
    fabric: {state: not_started, version: 1}
  - name: NVIDIA GB200
    fabric: {state: completed, version: 2, health_mask: 0x51A9}
  - name: NVIDIA GB200
    fabric: {state: not_supported}
""")
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES)
    try:
        values = [dict(s.values) for s in sampler.sample().devices]
    finally:
        sampler.close()
        nvml.shutdown()
    assert values[0]["fabric.state.not_started"] == 1
    assert not [k for k in values[0] if k.startswith("fabric.health")]  # no mask before v2
    assert values[1]["fabric.health.degraded_bandwidth"] == 1  # 0x51A9: its two bits say TRUE
    assert "fabric.health_summary" not in values[1]  # v3 only
    assert not [k for k in values[2] if k.startswith("fabric")]


def test_the_mask_decodes_as_nvml_documents_it():
    import pynvml

    assert fabric_health(pynvml, 0) == {}  # every part NOT_SUPPORTED: no condition at all
    healthy = fabric_health(pynvml, FABRIC_HEALTHY_MASK)
    assert len(healthy) == 7 and set(healthy.values()) == {0.0}
    wrong_config = FABRIC_HEALTHY_MASK & ~(0xF << 8) | (5 << 8)  # insufficient NVLinks
    assert fabric_health(pynvml, wrong_config)["fabric.health.incorrect_configuration"] == 1


@pytest.mark.parametrize(("fabric", "message"), [
    ("{state: registering}", "expected one of not_supported"),
    ("{status: NOPE}", "expected SUCCESS or an NVML_ERROR_ name"),
    ("{cluster_uuid: not-a-uuid}", "expected a UUID"),
    ("{version: 4}", "fabric.version"),
    ("{colour: red}", "unknown key"),
])
def test_a_bad_fabric_key_is_one_line_naming_it(tmp_path, fabric, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"devices:\n  - name: NVIDIA GB200\n    fabric: {fabric}\n")
    with pytest.raises(ScenarioError, match=message) as info:
        load_scenario(str(path))
    assert "devices[0].fabric" in str(info.value)
