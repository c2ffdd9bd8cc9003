"""The event detector: each kind of event, its hysteresis, its holders and its bound."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from otel_gpu._clock import Clock
from otel_gpu.export.events import records as ev
from otel_gpu.export.events.detector import EventDetector
from otel_gpu.export.naming import xid as xids
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sample.sources import THROTTLE_REASONS
from otel_gpu.snapshot import (
    DEGRADED,
    FAILED,
    OK,
    PREDICTED_FAILURE,
    Attribution,
    Containers,
    Pods,
    XidEvent,
)
from otel_gpu.workload import WORKLOAD_ATTRIBUTES, ContainerRef, Holder, JobRef, PodRef
from tests.support.nvml import SOURCES
from tests.support.snapshots import (
    GPU0,
    GPU1,
    MIG_A,
    MIG_B,
    gpu_device,
    mig_device,
    sample,
    snapshot,
)

THERMAL = dict(THROTTLE_REASONS)["hw_thermal_slowdown"]
POWER = dict(THROTTLE_REASONS)["sw_power_cap"]
G0 = gpu_device(GPU0, 0)


def run(detector: EventDetector, *samples_per_seq, pods=None) -> list[list[ev.Event]]:
    """Feed one snapshot per item (a DeviceSample or a tuple of them); the events of each."""
    out = []
    for seq, item in enumerate(samples_per_seq, 1):
        devices = item if isinstance(item, tuple) else (item,)
        out.append(detector.observe(snapshot(*devices, seq=seq, taken_at=1000.0 + seq,
                                             pods=pods)))
    return out


def names(batches: list[list[ev.Event]]) -> list[tuple[int, str, str | None]]:
    """(sample number, event name, phase) of every event."""
    return [(n, e.name, e.attributes.get(ev.EVENT_PHASE))
            for n, batch in enumerate(batches, 1) for e in batch]


def pods(**holders: tuple[Holder, ...]) -> Pods:
    return Pods(Attribution({uuid: hs for uuid, hs in holders.items()}))


def holder(pod: str, container: str = "main", shared: bool = False) -> Holder:
    return Holder(PodRef(pod, "ml", container), None, "nvidia.com/gpu", shared)


# --- XIDs -----------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "cls", "severity"), [
    (79, ev.XID_FATAL, ev.FATAL), (48, ev.XID_RESET, ev.ERROR), (13, ev.XID_INFO, ev.WARN),
    (4242, ev.XID_UNKNOWN, ev.WARN),
])
def test_an_xid_is_one_record_with_its_class_and_the_catalogue_message(code, cls, severity):
    detector = EventDetector()
    xid = XidEvent(code, 1234.5)
    (batch,) = run(detector, sample(G0, xid_events=(xid,)))
    (event,) = batch
    assert event.name == ev.XID_EVENT and event.severity == severity
    assert event.body == xids.message(code) and event.time == 1234.5
    assert event.attributes[ev.XID] == code and event.attributes[ev.XID_CLASS] == cls
    assert event.attributes["hw.id"] == GPU0


def test_every_catalogue_code_has_a_class():
    assert set(xids.MESSAGES) - {0} == set(ev.XID_CLASSES)


def test_an_xid_names_the_pod_holding_the_gpu_whole():
    detector = EventDetector()
    (batch,) = run(detector, sample(G0, xid_events=(XidEvent(79, 1.0),)),
                   pods=pods(**{GPU0: (holder("train-0"),)}))
    attrs = batch[0].attributes
    assert (attrs["k8s.pod.name"], attrs["k8s.namespace.name"], attrs["k8s.container.name"]) == (
        "train-0", "ml", "main")
    assert ev.HOLDERS not in attrs


def test_an_xid_names_the_hpc_jobs_using_the_gpu():
    """On bare metal the job is the workload that was hit: the record names it, as the
    device's series do, and the exporter moves it into the job's Resource."""
    detector = EventDetector()
    jobs = MappingProxyType({GPU0: (JobRef("1234"), JobRef("1240"))})
    batch = detector.observe(snapshot(sample(G0, xid_events=(XidEvent(79, 1.0),)), jobs=jobs))
    assert batch[0].attributes["nvidia.gpu.hpc.job.id"] == "1234,1240"


def test_an_xid_on_a_shared_gpu_lists_its_holders_and_names_no_pod():
    detector = EventDetector(holders_limit=2)
    shared = tuple(holder(f"p{i}", shared=True) for i in range(3))
    (batch,) = run(detector, sample(G0, xid_events=(XidEvent(31, 1.0),)),
                   pods=pods(**{GPU0: shared}))
    attrs = batch[0].attributes
    assert "k8s.pod.name" not in attrs
    assert attrs[ev.HOLDERS] == ("ml/p0/main", "ml/p1/main")  # bounded


def test_a_mig_xid_goes_to_the_instance_nvml_names_and_its_pod():
    g1 = gpu_device(GPU1, 1)
    a, b = mig_device(MIG_A, g1, gi=1), mig_device(MIG_B, g1, gi=2)
    detector = EventDetector()
    (batch,) = run(detector, (sample(g1, xid_events=(XidEvent(31, 1.0, 2, 0),)), sample(a),
                              sample(b)),
                   pods=pods(**{MIG_A: (holder("a"),), MIG_B: (holder("b"),)}))
    (event,) = batch
    attrs = event.attributes
    assert attrs["hw.id"] == MIG_B and attrs["hw.parent"] == GPU1
    assert attrs[ev.XID] == 31
    assert attrs["nvidia.gpu.mig.gpu_instance_id"] == 2
    assert attrs["nvidia.gpu.mig.compute_instance_id"] == 0
    assert attrs["k8s.pod.name"] == "b"


MIG_KEYS = ("nvidia.gpu.mig.gpu_instance_id", "nvidia.gpu.mig.compute_instance_id")


def test_an_xid_on_a_gpu_not_in_mig_mode_has_no_mig_ids_whatever_nvml_put_there():
    """NVIDIA's mock driver puts 0 where nvml.h says 0xFFFFFFFF: no instance 0 exists."""
    detector = EventDetector()
    (batch,) = run(detector, sample(G0, xid_events=(XidEvent(79, 1.0, 0, 0),)))
    (event,) = batch
    assert event.attributes["hw.id"] == GPU0
    assert not set(MIG_KEYS) & set(event.attributes), event.attributes


def test_an_xid_naming_a_mig_instance_that_does_not_exist_has_no_mig_ids():
    g1 = gpu_device(GPU1, 1)
    a = mig_device(MIG_A, g1, gi=1)
    (batch,) = run(EventDetector(),
                   (sample(g1, xid_events=(XidEvent(31, 1.0, 5, 0),)), sample(a)))
    (event,) = batch
    assert event.attributes["hw.id"] == GPU1
    assert not set(MIG_KEYS) & set(event.attributes), event.attributes


def test_a_republished_sample_gives_no_event_twice():
    detector = EventDetector()
    snap = snapshot(sample(G0, xid_events=(XidEvent(79, 1.0),)), seq=1)
    assert len(detector.observe(snap)) == 1
    assert detector.observe(snap) == []  # the same sample, published again with new pods


# --- state changes --------------------------------------------------------------------


def test_state_changes_worse_at_once_better_after_it_held():
    detector = EventDetector()
    seq = [OK, DEGRADED, PREDICTED_FAILURE, OK, PREDICTED_FAILURE, OK, OK, OK]
    batches = run(detector, *(sample(G0, state=s) for s in seq))
    changes = [(n, e.attributes.get(ev.PREVIOUS_STATE), e.attributes["hw.state"], e.severity)
               for n, b in enumerate(batches, 1) for e in b]
    assert changes == [
        (2, OK, DEGRADED, ev.WARN),
        (3, DEGRADED, PREDICTED_FAILURE, ev.ERROR),
        (8, PREDICTED_FAILURE, OK, ev.INFO),  # the flap at 4 did not hold
    ]


def test_a_gpu_lost_at_start_is_reported_with_its_placeholder_and_reason():
    lost = gpu_device("GPU-unknown-index-3", 3)
    detector = EventDetector()
    (batch,) = run(detector, sample(lost, state=FAILED, error="could not be opened: GPU is lost"))
    (event,) = batch
    assert event.name == ev.STATE_CHANGE and event.severity == ev.FATAL
    assert event.attributes["hw.id"] == "GPU-unknown-index-3"
    assert "GPU is lost" in event.body and ev.PREVIOUS_STATE not in event.attributes


def test_a_gpu_no_longer_listed_is_reported_once_and_forgotten():
    detector = EventDetector()
    g1 = gpu_device(GPU1, 1)
    batches = run(detector, (sample(G0), sample(g1)), (sample(G0),), (sample(G0),))
    assert names(batches) == [(2, ev.REMOVED, None)]
    assert batches[1][0].attributes["hw.id"] == GPU1


def test_hung_and_recovered():
    detector = EventDetector()
    hung = sample(G0, hung="reading power has not returned after 5.0 s")
    batches = run(detector, sample(G0), hung, sample(G0), hung, sample(G0), sample(G0))
    assert names(batches) == [(2, "nvidia.gpu.hung", "start"), (6, "nvidia.gpu.hung", "end")]
    assert "power has not returned" in batches[1][0].body


# --- episodes with hysteresis ---------------------------------------------------------


def test_flapping_throttle_is_one_start_and_one_end():
    detector = EventDetector()
    pattern = [0, THERMAL, THERMAL, THERMAL, 0, THERMAL, 0, 0, THERMAL, 0, 0, 0, 0]
    batches = run(detector, *(sample(G0, values={"clock.reasons": r}) for r in pattern))
    assert names(batches) == [(4, "nvidia.gpu.throttle.thermal", "start"),
                              (12, "nvidia.gpu.throttle.thermal", "end")]
    end = batches[11][0]
    assert end.severity == ev.INFO and end.attributes[ev.EVENT_DURATION] == 8.0
    assert end.attributes[ev.THROTTLE_KIND] == "thermal"


def test_a_short_throttle_is_no_event_and_kinds_are_separate():
    detector = EventDetector()
    pattern = [THERMAL, THERMAL, 0, POWER, POWER, POWER, POWER, 0, 0, 0]
    batches = run(detector, *(sample(G0, values={"clock.reasons": r}) for r in pattern))
    assert names(batches) == [(6, "nvidia.gpu.throttle.power", "start"),
                              (10, "nvidia.gpu.throttle.power", "end")]


def test_missing_values_neither_start_nor_end_an_episode():
    detector = EventDetector()
    on = sample(G0, values={"clock.reasons": THERMAL})
    batches = run(detector, on, on, on, sample(G0), sample(G0), sample(G0), sample(G0))
    assert names(batches) == [(3, "nvidia.gpu.throttle.thermal", "start")]


def test_row_remap_pending_and_failed():
    detector = EventDetector()
    v = [{"remap.pending": 0, "remap.failure": 0}, {"remap.pending": 1, "remap.failure": 0},
         {"remap.pending": 1, "remap.failure": 1}, {"remap.pending": 0, "remap.failure": 0},
         {"remap.pending": 0, "remap.failure": 0}]
    batches = run(detector, *(sample(G0, values=x) for x in v))
    assert names(batches) == [
        (2, "nvidia.gpu.row_remap.pending", "start"),
        (3, "nvidia.gpu.row_remap.failed", "start"),
        (5, "nvidia.gpu.row_remap.pending", "end"),
        (5, "nvidia.gpu.row_remap.failed", "end"),
    ]


def test_uncorrectable_ecc_rising_is_one_episode_with_its_total():
    detector = EventDetector()
    counts = [5, 5, 6, 9, 9, 9, 9, 9, 9, 9]  # a count there at start is not rising
    batches = run(detector, *(sample(G0, values={"ecc.uncorrected": c}) for c in counts))
    assert names(batches) == [(3, "nvidia.gpu.ecc.uncorrected", "start"),
                              (10, "nvidia.gpu.ecc.uncorrected", "end")]
    assert batches[2][0].attributes[ev.ECC_ERRORS] == 1
    assert batches[9][0].attributes[ev.ECC_ERRORS] == 4


def test_pcie_width_below_max_and_an_idle_gpu_lowering_its_generation():
    detector = EventDetector()
    idle_gen1 = {"pcie.link.gen": 1, "pcie.link.gen.max": 5, "pcie.link.width": 16,
                 "pcie.link.width.max": 16, "util.gpu": 0}
    narrow = {**idle_gen1, "pcie.link.gen": 5, "pcie.link.width": 8, "util.gpu": 90}
    full = {**narrow, "pcie.link.width": 16}
    seq = [idle_gen1] * 4 + [narrow] * 3 + [full] * 3
    batches = run(detector, *(sample(G0, values=v) for v in seq))
    assert names(batches) == [(7, "nvidia.gpu.pcie.link.degraded", "start"),
                              (10, "nvidia.gpu.pcie.link.degraded", "end")]
    assert "x8 of x16" in batches[6][0].body


def test_an_nvlink_going_down_names_the_link():
    detector = EventDetector()
    up, one_down = {"nvlink.active": 0b111, "power": 1}, {"nvlink.active": 0b101, "power": 1}
    none_up = {"power": 1}  # no active link: the reader gives no key at all
    seq = [up, one_down, one_down, none_up, none_up, up, up]
    batches = run(detector, *(sample(G0, values=v) for v in seq))
    got = [(n, e.attributes[ev.NVLINK_LINK], e.attributes[ev.EVENT_PHASE])
           for n, b in enumerate(batches, 1) for e in b]
    assert got == [(3, 1, "start"), (5, 0, "start"), (5, 2, "start"),
                   (7, 0, "end"), (7, 1, "end"), (7, 2, "end")]


# --- bounds ---------------------------------------------------------------------------


def test_events_past_the_cap_are_counted_as_dropped():
    detector = EventDetector(max_events=3)
    assert detector.dropped == 0
    xid = tuple(XidEvent(13, float(i)) for i in range(5))
    (batch,) = run(detector, sample(G0, xid_events=xid))
    assert len(batch) == 3 and detector.dropped == 2


# --- the sampler hands the XID details on ---------------------------------------------


def test_the_sampler_hands_each_xid_on_once_with_its_mig_ids(fake_nvml):
    fake_nvml("""
        devices:
          - name: NVIDIA A100-SXM4-40GB
            memory: {total: 1000, used: 10}
            mig_capable: true
            mig: [{profile: 1g.5gb, gpu_instance_id: 7, compute_instance_id: 0,
                   memory: {total: 100, used: 1}}]
            xid: [{sample: 2, code: 79}, {sample: 2, code: 31, gpu_instance_id: 7,
                   compute_instance_id: 0}]
    """)
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES, clock=Clock(wall=lambda: 4242.0))
    try:
        assert sampler.sample().devices[0].xid_events == ()
        gpu, mig = sampler.sample().devices
        assert gpu.xid_events == (XidEvent(79, 4242.0, None, None), XidEvent(31, 4242.0, 7, 0))
        assert mig.xid_events == ()
        assert sampler.sample().devices[0].xid_events == ()  # handed on once
    finally:
        sampler.close()


def test_a_mig_instance_destroyed_in_a_relayout_is_no_event():
    g1 = gpu_device(GPU1, 1)
    a = mig_device(MIG_A, g1, gi=1)
    detector = EventDetector()
    assert names(run(detector, (sample(g1), sample(a)), (sample(g1),))) == []


def test_the_counters_are_catalog_rows_there_at_zero():
    detector = EventDetector(max_events=1)
    rows = {m.name: m for m in detector.metrics()}
    snap = snapshot(sample(G0))
    assert list(rows["otel_gpu.events.dropped"].per_node(snap, 0.0)) == [(0.0, {})]
    run(detector, sample(G0, xid_events=(XidEvent(13, 1.0), XidEvent(13, 2.0))))
    assert list(rows["otel_gpu.events.dropped"].per_node(snap, 0.0)) == [(1.0, {})]
    assert list(rows["otel_gpu.events"].per_node(snap, 0.0)) == [(1.0, {})]


# --- one device identity for metrics and events ---------------------------------------


def _device_keys(attrs) -> dict:
    """The device's own attributes among a record's (its workload's and the event's left out)."""
    from otel_gpu.instrument.attributes import DEVICE_ATTRIBUTES

    keys = {key for key, _ in DEVICE_ATTRIBUTES} - set(WORKLOAD_ATTRIBUTES)
    return {k: v for k, v in attrs.items() if k in keys}


@pytest.mark.parametrize("which", ["gpu", "mig", "unknown bus id", "kubelet numa"])
def test_a_record_names_its_device_exactly_as_its_metrics_do(which):
    """Events and instruments take a device's attributes from the one device_attributes():
    the same keys and values as nvidia.gpu.info (hw.type, which the hardware conventions
    ask for, and a MIG instance's profile included; nothing NVML did not give)."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gpu.instrument.telemetry import build_meter_provider, build_resource

    g1 = gpu_device(GPU1, 1, serial="1650", numa_node=0,
                    pci_bus_id="" if which == "unknown bus id" else "00000000:3C:00.0")
    mig = mig_device(MIG_A, g1, gi=1)
    target = mig if which == "mig" else g1
    holders = pods(**{target.uuid: (holder("a"),)})
    if which == "kubelet numa":
        holders = Pods(Attribution({target.uuid: (holder("a"),)}, numa={target.uuid: (1,)}))
    xid = XidEvent(31, 1.0, 1, 0) if which == "mig" else XidEvent(31, 1.0)
    snap = snapshot(sample(g1, xid_events=(xid,)), sample(mig), seq=1, pods=holders)
    (event,) = EventDetector().observe(snap)

    reader = InMemoryMetricReader()
    provider = build_meter_provider(build_resource(environ={}), [reader], lambda: snap)
    try:
        data = reader.get_metrics_data()
    finally:
        provider.shutdown()
    info = next(m for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name == "nvidia.gpu.info")
    (point,) = [p for p in info.data.data_points if p.attributes["hw.id"] == target.uuid]
    assert _device_keys(event.attributes) == _device_keys(point.attributes)
    assert event.attributes["hw.type"] == "gpu"
    assert all(v != "" for v in point.attributes.values())  # absent, never empty


TRAINER = ContainerRef("3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899",
                       "trainer", "pytorch/pytorch")


def _workload_keys(attrs) -> dict:
    """The workload's attributes among a record's or a point's (the device's left out)."""
    return {k: v for k, v in attrs.items() if k in WORKLOAD_ATTRIBUTES}


@pytest.mark.parametrize("workloads", ["container", "container and job", "pod and job"])
def test_a_record_names_its_workload_exactly_as_its_gpus_metrics_do(workloads):
    """An XID on a GPU a Docker container uses alone (no Kubernetes): its series carry the
    container, so its record does too, and the OTLP exporters put both under the same
    container's Resource. Events and instruments take the workload's attributes from the
    one workload value the snapshot carries."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gpu.instrument.telemetry import build_meter_provider, build_resource

    fields: dict = {}
    if "container" in workloads:
        fields["containers"] = Containers(devices=MappingProxyType({GPU0: (TRAINER,)}))
    if "pod" in workloads:
        fields["pods"] = pods(**{GPU0: (holder("train-0"),)})
    if "job" in workloads:
        fields["jobs"] = MappingProxyType({GPU0: (JobRef("1234"), JobRef("1240"))})
    snap = snapshot(sample(G0, values={"power": 300_000}, xid_events=(XidEvent(79, 1.0),)),
                    **fields)
    (event,) = EventDetector().observe(snap)

    reader = InMemoryMetricReader()
    provider = build_meter_provider(build_resource(environ={}), [reader], lambda: snap)
    try:
        data = reader.get_metrics_data()
    finally:
        provider.shutdown()
    series = {frozenset(_workload_keys(p.attributes).items())
              for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name in ("hw.power", "hw.status") for p in m.data.data_points}
    (metrics,) = series  # every series of the GPU names one workload
    assert _workload_keys(event.attributes) == dict(metrics)
    if "container" in workloads:
        assert _workload_keys(event.attributes).items() >= TRAINER.attributes().items()
        assert event.attributes["container.name"] == "trainer"
