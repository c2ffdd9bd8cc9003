"""Instruments read the snapshot; the Resource follows the OTEL_* rules."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.instrument.attributes import (
    IDENTITY_ATTRIBUTES,
    NUMA_NODE,
    device_attributes,
    identity_attributes,
)
from otel_gpu.instrument.cardinality import SDK_CARDINALITY_LIMIT, cardinality, room_for
from otel_gpu.instrument.catalog import CATALOG
from otel_gpu.instrument.instruments import Instruments
from otel_gpu.instrument.telemetry import Telemetry, build_meter_provider, build_resource
from otel_gpu.snapshot import FAILED, OK, Attribution, Device, DeviceSample, Pods
from otel_gpu.workload import (
    HPC_JOB_ID,
    POD_ATTRIBUTES,
    WORKLOAD_ATTRIBUTES,
    Holder,
    JobRef,
    PodRef,
)
from tests.support.providers import NoMeter
from tests.support.snapshots import snapshot

GPU = Device("GPU-aaaa", 0, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "00000000:18:00.0",
             minor_number=0, serial="1654922000001")
MIG = Device("MIG-bbbb", 1, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA A100-SXM4-40GB",
             "00000000:3B:00.0", parent_uuid="GPU-cccc", gpu_instance_id=13,
             compute_instance_id=0, mig_profile="1g.5gb")


def _snapshot(samples, seq=1, taken=100.0):
    return snapshot(*samples, seq=seq, taken_monotonic=taken, nvml_calls=42)


def _points(reader):
    out = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = [(p.value, dict(p.attributes)) for p in metric.data.data_points]
    return out


@pytest.fixture
def pipeline():
    state = {"snap": None, "now": 105.0}
    reader = InMemoryMetricReader()
    provider = build_meter_provider(build_resource(environ={}), [reader],
                                       lambda: state["snap"], clock=lambda: state["now"])
    yield state, reader
    provider.shutdown()


def test_nothing_before_the_first_sample(pipeline):
    state, reader = pipeline
    assert _points(reader) == {}


def test_values_are_converted_and_attributed(pipeline):
    state, reader = pipeline
    values = {"util.gpu": 45, "memory.used": 2 * 2**30, "memory.total": 8 * 2**30, "power": 312_500,
              "energy": 9_000_000, "temp.gpu": 61, "clock.sm": 1980}
    state["snap"] = _snapshot([DeviceSample(GPU, OK, MappingProxyType(values))])
    points = _points(reader)
    attrs = device_attributes(GPU, "550.90.07")  # the default: every device attribute
    assert attrs["hw.id"] == "GPU-aaaa" and attrs["hw.model"] == GPU.model
    assert points["nvidia.gpu.info"] == [(1, device_attributes(GPU, "550.90.07"))]
    assert points["hw.power"] == [(312.5, attrs)]
    assert points["hw.energy"] == [(9000.0, attrs)]
    assert points["hw.gpu.memory.usage"] == [(2 * 2**30, attrs)]
    assert points["hw.gpu.memory.utilization"] == [(0.25, attrs)]
    assert points["hw.gpu.utilization"] == [(0.45, {**attrs, "hw.gpu.task": "general"})]
    assert points["hw.temperature"] == [(61, {**attrs, "hw.sensor_location": "gpu"})]
    assert points["nvidia.gpu.clock.frequency"] == [
        (1.98e9, {**attrs, "nvidia.gpu.clock.domain": "sm"})]
    assert "nvidia.gpu.fan.speed" not in points  # never read: no series, not a zero
    assert points["otel_gpu.sample.age"] == [(5.0, {})]
    assert points["otel_gpu.nvml.requests"] == [(42, {})]


def test_device_attributes():
    attrs = device_attributes(GPU, "550.90.07")
    assert attrs == {
        "hw.id": "GPU-aaaa", "hw.type": "gpu", "hw.vendor": "NVIDIA",
        "hw.model": "NVIDIA H100 80GB HBM3", "hw.name": "NVIDIA H100 80GB HBM3",
        "nvidia.gpu.index": 0, "nvidia.gpu.pci_bus_id": "00000000:18:00.0",
        "hw.driver_version": "550.90.07", "hw.serial_number": "1654922000001",
    }
    mig = device_attributes(MIG, None)
    assert mig["hw.parent"] == "GPU-cccc"
    assert mig["nvidia.gpu.mig.profile"] == "1g.5gb"
    assert mig["nvidia.gpu.mig.gpu_instance_id"] == 13
    assert "hw.driver_version" not in mig


# --- device_attributes: identity on every series, the rest on nvidia.gpu.info ----------

DESCRIPTIVE = {"hw.vendor", "hw.model", "hw.name", "hw.driver_version", "hw.serial_number",
               "nvidia.gpu.pci_bus_id", "nvidia.gpu.numa_node"}
HELD = Device("GPU-dddd", 0, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3",
              "00000000:18:00.0", serial="1654922000002", numa_node=0)
MIG_PARENT = Device("GPU-cccc", 1, "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB",
                    "00000000:3B:00.0", serial="1654922000003", numa_node=1)
MIG_JOB = Device("MIG-eeee", 1, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "NVIDIA A100-SXM4-40GB",
                 "00000000:3B:00.0", parent_uuid="GPU-cccc", gpu_instance_id=2,
                 compute_instance_id=0, mig_profile="3g.20gb")
LOST = Device("GPU-ffff", 2, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3",
              "00000000:1A:00.0", serial="1654922000004")
VALUES = MappingProxyType({"power": 300_000, "energy": 5_000_000, "temp.gpu": 50,
                           "util.gpu": 40, "memory.used": 2**30, "memory.total": 2**33})


def _mixed_node():
    """A GPU held whole by a pod (the kubelet placing it on another NUMA node than NVML),
    a GPU in MIG mode with an instance held whole and one running an HPC job, a lost GPU."""
    holder = Holder(PodRef("train", "ml", "main"), None, "nvidia.com/gpu")
    mig_holder = Holder(PodRef("small", "ml", "srv"), None, "nvidia.com/mig-1g.5gb")
    attribution = Attribution({HELD.uuid: (holder,), MIG.uuid: (mig_holder,)},
                              numa={HELD.uuid: (1,)})
    samples = [DeviceSample(d, OK, VALUES) for d in (HELD, MIG_PARENT, MIG, MIG_JOB)]
    samples.append(DeviceSample(LOST, FAILED, error="GPU is lost"))
    return snapshot(*samples, pods=Pods(attribution),
                    jobs=MappingProxyType({MIG_JOB.uuid: (JobRef("4242"),)}))


WORKLOAD = {HELD.uuid: {"k8s.pod.name": "train", "k8s.namespace.name": "ml",
                        "k8s.container.name": "main"},
            MIG.uuid: {"k8s.pod.name": "small", "k8s.namespace.name": "ml",
                       "k8s.container.name": "srv"},
            MIG_JOB.uuid: {HPC_JOB_ID: "4242"}}


def _collect(setting: str):
    snap = _mixed_node()
    reader = InMemoryMetricReader()
    provider = build_meter_provider(build_resource(environ={}), [reader], lambda: snap,
                                    clock=lambda: 5.0, device_attributes=setting)
    try:
        return _points(reader)
    finally:
        provider.shutdown()


def _device_series(points):
    """(metric, device attributes) of every series of a device, its own point attributes
    taken off (the metrics of one device, not of the node)."""
    for metric in CATALOG:
        if metric.per_node is not None or metric.describes_device:
            continue
        own = set(metric.attribute_keys())
        for _, attrs in points.get(metric.name, []):
            yield metric.name, {k: v for k, v in attrs.items() if k not in own}


def _info(points) -> dict[str, dict]:
    info = {a["hw.id"]: a for _, a in points["nvidia.gpu.info"]}
    assert len(info) == len(points["nvidia.gpu.info"]), "one info series per device"
    assert {v for v, _ in points["nvidia.gpu.info"]} == {1}
    return info


def _described(device: Device, numa: int | None = None) -> dict:
    attrs = device_attributes(device, "550.90.07")
    if numa is not None:
        attrs[NUMA_NODE] = numa
    return attrs


def test_identity_keeps_the_device_and_its_workload_and_info_holds_the_rest():
    points = _collect("identity")
    seen = set()
    for name, attrs in _device_series(points):
        uuid = attrs["hw.id"]
        seen.add((name, uuid))
        device = {d.uuid: d for d in (HELD, MIG_PARENT, MIG, MIG_JOB, LOST)}[uuid]
        expected = {**identity_attributes(_described(device)), **WORKLOAD.get(uuid, {})}
        assert attrs == expected, (name, uuid)
        assert not DESCRIPTIVE & set(attrs)
    assert {("hw.power", d.uuid) for d in (HELD, MIG_PARENT, MIG, MIG_JOB)} <= seen
    assert ("hw.status", LOST.uuid) in seen
    mig = {k for _, a in _device_series(points) if a["hw.id"] == MIG.uuid for k in a}
    assert mig == {"hw.id", "hw.type", "nvidia.gpu.index", "hw.parent",
                   "nvidia.gpu.mig.profile", "nvidia.gpu.mig.gpu_instance_id",
                   "nvidia.gpu.mig.compute_instance_id",
                   *POD_ATTRIBUTES} - {"k8s.pod.uid"}  # no UID known
    # one info series per GPU and MIG instance, the lost GPU's too, with every attribute,
    # the kubelet's NUMA node beating NVML's, and no pod or job (it is not theirs)
    info = _info(points)
    assert info == {HELD.uuid: _described(HELD, numa=1), MIG_PARENT.uuid: _described(MIG_PARENT),
                    MIG.uuid: _described(MIG), MIG_JOB.uuid: _described(MIG_JOB),
                    LOST.uuid: _described(LOST)}
    assert set(info[HELD.uuid]) >= DESCRIPTIVE and info[HELD.uuid][NUMA_NODE] == 1
    assert DESCRIPTIVE - {"hw.serial_number", NUMA_NODE} <= set(info[MIG.uuid])
    assert info[MIG.uuid]["hw.parent"] == MIG_PARENT.uuid
    for attrs in info.values():
        assert not set(WORKLOAD_ATTRIBUTES) & set(attrs)
        assert {k for k in attrs if k in IDENTITY_ATTRIBUTES} >= {"hw.id", "nvidia.gpu.index"}


def test_all_keeps_every_attribute_on_every_series_and_the_info_metric_too():
    points = _collect("all")
    identity = _collect("identity")
    count = 0
    for name, attrs in _device_series(points):
        count += 1
        device = {d.uuid: d for d in (HELD, MIG_PARENT, MIG, MIG_JOB, LOST)}[attrs["hw.id"]]
        numa = 1 if device is HELD else None
        assert attrs == {**_described(device, numa), **WORKLOAD.get(device.uuid, {})}, name
    assert count == len(list(_device_series(identity)))  # the same series, more attributes
    assert _info(points) == _info(identity)


def test_attribute_sets_are_made_once_while_nothing_changes():
    snap = _mixed_node()
    info_metric = next(m for m in CATALOG if m.describes_device)
    power = next(m for m in CATALOG if m.name == "hw.power")
    # a row with a point attribute of its own (hw.gpu.task), and node-level rows
    utilization = next(m for m in CATALOG if m.name == "hw.gpu.utilization")
    node_rows = [m for m in CATALOG if m.per_node is not None]
    instruments = Instruments(NoMeter(), lambda: state["snap"])
    state = {"snap": snap}
    rows = [info_metric, power, utilization, *node_rows]
    first = [[o.attributes for o in instruments.observe(m)] for m in rows]
    assert sum(map(len, first[3:])) >= 10, "node-level rows to compare"
    assert first[2] and all("hw.gpu.task" in a for a in first[2]), "a point attribute"
    state["snap"] = _mixed_node()  # the next sample: the same devices and pods
    for metric, before in zip(rows, first, strict=True):
        after = [o.attributes for o in instruments.observe(metric)]
        if metric.name == "otel_gpu.sample.age":
            continue
        assert len(after) == len(before), metric.name
        assert all(a is b for a, b in zip(before, after, strict=True)), metric.name


def test_an_unknown_device_attributes_setting_is_refused():
    with pytest.raises(ValueError, match="identity or all"):
        Instruments(NoMeter(), lambda: None, device_attributes="some")


def test_failed_device_series_disappear(pipeline):
    state, reader = pipeline
    state["snap"] = _snapshot([DeviceSample(GPU, OK, MappingProxyType({"temp.gpu": 61}))])
    assert "hw.temperature" in _points(reader)
    state["snap"] = _snapshot([DeviceSample(GPU, FAILED, error="GPU is lost")], seq=2)
    points = _points(reader)
    assert points.get("hw.temperature", []) == []
    status = {a["hw.state"]: v for v, a in points["hw.status"]}
    assert status["failed"] == 1 and status["ok"] == 0


def test_resource_defaults_and_overrides():
    res = build_resource(environ={"NODE_NAME": "node-1"}).attributes
    assert res["service.name"] == "otel-gpu"
    assert res["k8s.node.name"] == "node-1"
    assert res["host.name"]
    assert res["service.version"]
    env = {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=from-attrs",
           "OTEL_SERVICE_NAME": "gpu-fleet"}
    res = build_resource("node-2", environ=env).attributes
    assert res["deployment.environment"] == "prod"
    assert res["service.name"] == "gpu-fleet"  # OTEL_SERVICE_NAME wins
    assert res["k8s.node.name"] == "node-2"


def test_resource_from_process_environment(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "cloud.region=eu-west-4")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gpus")
    res = build_resource().attributes
    assert res["cloud.region"] == "eu-west-4"
    assert res["service.name"] == "gpus"


# --- the cardinality limit: every live pod keeps its own series ---------------------

OVERFLOW = "otel.metric.overflow"


def _time_sliced(holders: int, seq: int = 1):
    """GPU shared by ``holders`` pods (time-slicing replicas), one allocation series each."""
    attribution = Attribution({GPU.uuid: tuple(
        Holder(PodRef(f"slice-{i}", "ml", "srv"), i, "nvidia.com/gpu", True)
        for i in range(holders))})
    return snapshot(DeviceSample(GPU, OK, MappingProxyType({"power": 300_000})), seq=seq,
                    pods=Pods(attribution))


def _allocation_pods(reader) -> list[str]:
    points = _points(reader).get("nvidia.gpu.k8s.allocation", [])
    assert not [a for _, a in points if a.get(OVERFLOW)], "live pods folded into overflow"
    return sorted(a["k8s.pod.name"] for _, a in points)


def _telemetry(latest):
    readers: list[list[InMemoryMetricReader]] = []

    def make():
        readers.append([InMemoryMetricReader(), InMemoryMetricReader()])  # Prometheus, OTLP
        return list(readers[-1]), lambda: None  # collected through the readers here

    return Telemetry(build_resource(environ={}), latest, make), readers


def test_more_holders_than_the_sdk_default_each_keep_a_series():
    snap = _time_sliced(2500)
    telemetry, readers = _telemetry(lambda: snap)
    try:
        assert telemetry.cardinality_limit >= 2 * 2500 > SDK_CARDINALITY_LIMIT
        for reader in readers[-1]:  # every reader, not only Prometheus
            assert len(_allocation_pods(reader)) == 2500
    finally:
        telemetry.shutdown(1)


def test_rebuild_sizes_the_limit_for_pods_that_arrived():
    state = {"snap": _time_sliced(4)}
    telemetry, readers = _telemetry(lambda: state["snap"])
    try:
        first = telemetry.cardinality_limit
        assert first == cardinality(state["snap"], CATALOG)[0]
        assert telemetry.room >= room_for(4)
        arrived = first + 500
        state["snap"] = _time_sliced(arrived, seq=2)
        points = _points(readers[-1][0])["nvidia.gpu.k8s.allocation"]
        assert [a for _, a in points if a.get(OVERFLOW)]  # what the SDK does past its limit
        room = telemetry.rebuild()
        assert room == telemetry.room >= room_for(arrived)
        assert telemetry.cardinality_limit > first
        assert len(readers) == 2 and len(_allocation_pods(readers[-1][0])) == arrived
    finally:
        telemetry.shutdown(1)


def test_one_collection_reads_one_snapshot_even_if_a_publish_lands_in_the_middle():
    from otel_gpu.export.collected import CollectingReader
    from otel_gpu.export.prometheus.text import TextWriter
    from otel_gpu.instrument.telemetry import Telemetry

    def sample_of(watts: float, seq: int):
        values = MappingProxyType({"power": watts * 1000, "memory.used": seq,
                                   "memory.total": 100.0, "temp.gpu": seq})
        return snapshot(DeviceSample(GPU, OK, values), seq=seq)

    first, second = sample_of(100.0, 1), sample_of(200.0, 2)
    calls = {"n": 0}

    def latest():  # the first read sees sample 1; every later one, sample 2
        calls["n"] += 1
        return first if calls["n"] == 1 else second

    def readers():
        reader = CollectingReader()
        return [reader], reader.collect_now

    telemetry = Telemetry(build_resource(environ={}), latest, readers)
    calls["n"] = 0  # from here on, as the store would answer: sample 2 published mid-way
    try:
        body = TextWriter().write(telemetry.collect()).decode()
    finally:
        telemetry.shutdown(0.5)
    assert calls["n"] == 1, "every instrument must read the snapshot the collection began with"
    assert "hw_power_watts{" in body and " 100.0" in body.split("hw_power_watts{")[1]
    assert 'hw_temperature_celsius{' in body
    temps = [ln for ln in body.splitlines() if ln.startswith("hw_temperature_celsius{")]
    assert temps and all(ln.endswith(" 1.0") for ln in temps), temps


def test_otlp_pushes_the_scrapes_collection_and_pins_its_own_to_one_snapshot():
    import math

    from otel_gpu.export.collected import CollectingReader
    from otel_gpu.export.otlp.push import OtlpPush
    from otel_gpu.export.prometheus.text import TextWriter
    from otel_gpu.instrument.telemetry import Telemetry
    from tests.support.exporters import RecordingExporter

    def sample_of(watts: float, seq: int):
        return snapshot(DeviceSample(GPU, OK, MappingProxyType({"power": watts * 1000,
                                                                "temp.gpu": seq})), seq=seq)

    state = {"reads": 0, "snaps": [sample_of(100.0, 1)]}
    exporter = RecordingExporter()
    built = {}

    def latest():
        state["reads"] += 1
        return state["snaps"][min(state["reads"], len(state["snaps"])) - 1]

    def readers():
        source = CollectingReader()
        push = built["push"] = OtlpPush(exporter, source, interval_s=math.inf, environ={})
        return [source, push], source.collect_now

    telemetry = Telemetry(build_resource(environ={}), latest, readers)
    try:
        state["reads"] = 0
        body = TextWriter().write(telemetry.collect())
        built["push"].push()
        assert built["push"].collected == 0, "the scrape's collection is the one pushed"
        (data,) = exporter.exported
        assert " 100.0" in body.decode().split("hw_power_watts{")[1].splitlines()[0]
        power = [p.value for rm in data.resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics if m.name == "hw.power" for p in m.data.data_points]
        assert power == [100.0]
        # a push that collects by itself reads one snapshot, though a publish lands mid-way
        state["reads"], state["snaps"] = 0, [sample_of(200.0, 2), sample_of(300.0, 3)]
        built["push"].push()
        assert state["reads"] == 1 and built["push"].collected == 1
        temps = [p.value for rm in exporter.exported[1].resource_metrics
                 for sm in rm.scope_metrics for m in sm.metrics if m.name == "hw.temperature"
                 for p in m.data.data_points]
        assert temps == [2]
    finally:
        telemetry.shutdown(0.5)
