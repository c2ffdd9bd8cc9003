"""GPU events end to end: the real process, the fake driver's XID and throttling scripts, a
fake kubelet, and the records at a real OTLP receiver."""

from __future__ import annotations

import textwrap

import pynvml
import pytest

from testkit.exposition import series
from testkit.kubelet import container, devices, pod
from testkit.process import wait_until

HELD = "GPU-8a1c7f00-0000-4000-8000-000000000001"
FREE = "GPU-8a1c7f00-0000-4000-8000-000000000002"
H100 = "NVIDIA H100 80GB HBM3"
THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
XID_AT = 20
"""The XID comes late enough for the kubelet's first answer to be there."""
# Sample n reads element n-1: thermal throttling in samples 3-6, a one-sample flap back at 8
# (inside the hysteresis: no record), then none; zeros long past the end of the test.
THROTTLE = [0, 0, THERMAL, THERMAL, THERMAL, THERMAL, 0, THERMAL] + [0] * 200
FAST = {"OTEL_METRIC_EXPORT_INTERVAL": "500", "OTEL_EXPORTER_OTLP_TIMEOUT": "5"}


def _scenario(tmp_path) -> str:
    path = tmp_path / "events.yaml"
    path.write_text(textwrap.dedent(f"""
        driver_version: "550.90.07"
        devices:
          - name: {H100}
            uuid: {HELD}
            memory: {{total: 85520809984, used: 1}}
            power: 300000
            clock_event_reasons: 0
            xid: [{{sample: {XID_AT}, code: 79}}]
            lost_after: {XID_AT}
          - name: {H100}
            uuid: {FREE}
            memory: {{total: 85520809984, used: 1}}
            power: 300000
            clock_event_reasons: {THROTTLE}
    """))
    return str(path)


def _named(name: str, uuid: str):
    return lambda r: r.event_name == name and r.attributes.get("hw.id") == uuid


@pytest.mark.slow  # seconds of real time (retries, timeouts, many samples): not in the quick loop
def test_an_xid_79_and_a_throttling_episode_arrive_as_log_records(
        collector, receiver, kubelet, tmp_path):
    kubelet.set_pods([pod("train-0", container("main", devices("nvidia.com/gpu", HELD)),
                          namespace="ml")])
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, "NODE_NAME": "gpu-node-7",
           **FAST}
    proc = collector("--simulate", _scenario(tmp_path), "--kubelet-socket",
                     kubelet.socket_path, "--kubelet-interval", "0.1", env=env,
                     interval="0.25")
    receiver.wait_for_logs(_named("nvidia.gpu.state.change", HELD), timeout=60)
    receiver.wait_for_logs(lambda r: r.event_name == "nvidia.gpu.throttle.thermal"
                           and r.attributes.get("nvidia.gpu.event.phase") == "end", timeout=60)
    text = proc.wait_sample(XID_AT + 6)  # a few samples more: nothing repeats
    assert series(text, "otel_gpu_events_dropped_total")[0][1] == 0  # there, at 0
    assert series(text, "otel_gpu_events_total")[0][1] >= 4
    code, _ = proc.stop()
    assert code == 0
    rows = receiver.log_records()

    (xid,) = [r for r in rows if r.event_name == "nvidia.gpu.xid"]
    assert xid.resource["k8s.pod.name"] == "train-0"
    assert xid.resource["k8s.namespace.name"] == "ml"
    assert xid.resource["k8s.container.name"] == "main"
    assert xid.resource["k8s.node.name"] == "gpu-node-7"
    assert xid.severity_text == "FATAL" and xid.severity_number == 21
    assert xid.body == "GPU no longer reachable on the PCIe bus"
    assert xid.attributes["hw.id"] == HELD and xid.attributes["nvidia.gpu.xid"] == 79
    assert xid.attributes["nvidia.gpu.xid.class"] == "fatal"
    assert not {"k8s.pod.name", "k8s.namespace.name"} & set(xid.attributes)

    (lost,) = [r for r in rows if _named("nvidia.gpu.state.change", HELD)(r)]
    assert lost.attributes["hw.state"] == "failed" and lost.severity_text == "FATAL"
    assert lost.resource["k8s.pod.name"] == "train-0"

    throttle = [r for r in rows if r.event_name.startswith("nvidia.gpu.throttle")]
    phases = [(r.event_name, r.attributes["nvidia.gpu.event.phase"]) for r in throttle]
    assert phases == [("nvidia.gpu.throttle.thermal", "start"),
                      ("nvidia.gpu.throttle.thermal", "end")]
    start, end = throttle
    assert all(r.attributes["hw.id"] == FREE for r in throttle)
    assert all("k8s.pod.name" not in r.resource for r in throttle)  # a free GPU: the node's
    assert start.severity_text == "WARN" and end.severity_text == "INFO"
    assert end.attributes["nvidia.gpu.event.duration"] > 0
    assert start.time_unix_nano < end.time_unix_nano

    # the collector's own XID line is on stderr once, and only there
    assert sum("reported XID 79" in line for line in proc.lines) == 1
    assert not any(r.body and "reported XID" in str(r.body) for r in rows)


@pytest.mark.slow  # seconds of real time (retries, timeouts, many samples): not in the quick loop
def test_logs_off_with_otel_logs_exporter_none(collector, receiver, tmp_path):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, "OTEL_LOGS_EXPORTER": "none",
           **FAST}
    proc = collector("--simulate", _scenario(tmp_path), env=env, interval="0.25")
    proc.wait_sample(XID_AT + 2)
    receiver.wait_for(lambda req: "hw.power" in req.metric_names(), timeout=30)
    proc.stop()
    assert receiver.log_requests == []
    assert "GPU events are not sent" in proc.log


TRAINER = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
CONTAINER_KEYS = ("container.id", "container.name", "container.image.name")


@pytest.mark.slow  # seconds of real time (many samples, a real receiver): not in the quick loop
def test_an_xid_on_a_gpu_a_docker_container_uses_arrives_under_the_containers_resource(
        collector, receiver, tmp_path):
    """No Kubernetes: a Docker container alone on a GPU names the GPU's series, and the XID
    record of that GPU arrives under the same container Resource as its metrics."""
    from tests.support.container_runtime import FakeRuntime, docker_container

    scenario = tmp_path / "docker.yaml"
    scenario.write_text(textwrap.dedent(f"""
        driver_version: "550.90.07"
        devices:
          - name: NVIDIA A10
            uuid: {HELD}
            memory: {{total: 25769803776, used: 2147483648}}
            processes:
              - {{pid: 501, used_memory: 2147483648, sm: 60, memory_util: 15}}
            xid: [{{sample: {XID_AT}, code: 13}}]
    """))
    proc_root = tmp_path / "proc"
    (proc_root / "501").mkdir(parents=True)
    (proc_root / "501" / "cgroup").write_text(f"0::/system.slice/docker-{TRAINER}.scope\n")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, **FAST}
    with FakeRuntime() as runtime:
        runtime.set_containers([docker_container(TRAINER, "trainer", "pytorch/pytorch:2.3.1")])
        proc = collector("--simulate", str(scenario), "--kubelet-socket",
                         str(tmp_path / "no-kubelet.sock"), "--process-usage", "true",
                         "--proc-root", str(proc_root), "--container-socket",
                         runtime.socket_path, env=env, interval="0.25")
        (xid,) = receiver.wait_for_logs(lambda r: r.event_name == "nvidia.gpu.xid", timeout=60)
        req = receiver.wait_for(lambda r: any(
            row.metric == "hw.gpu.memory.usage" and row.resource.get("container.name")
            for row in r.rows()), timeout=30)[-1]
        proc.stop()
    (gpu,) = [r for r in req.rows() if r.metric == "hw.gpu.memory.usage"]
    expected = {"container.id": TRAINER, "container.name": "trainer",
                "container.image.name": "pytorch/pytorch"}
    assert {k: gpu.resource.get(k) for k in CONTAINER_KEYS} == expected
    assert {k: xid.resource.get(k) for k in CONTAINER_KEYS} == expected
    assert not set(CONTAINER_KEYS) & set(xid.attributes)  # the Resource's, not the record's
    assert xid.attributes["hw.id"] == HELD and xid.attributes["nvidia.gpu.xid"] == 13


LATE_XIDS = 60
"""XIDs waiting at once: at 0.05 s a wait, draining them takes three read deadlines."""


@pytest.mark.slow  # seconds of real time (slow driver calls, many samples): not in the quick loop
def test_xids_drained_after_the_read_deadline_are_counted_and_sent(collector, receiver,
                                                                   tmp_path):
    """A drain of the event set that outlasts the read deadline has taken its events out of
    the driver: each is counted and sent all the same, and the other reads stay fresh."""
    path = tmp_path / "late.yaml"
    path.write_text(textwrap.dedent(f"""
        driver_version: "550.90.07"
        shapes: [{{function: nvmlEventSetWait_v2, shape: 'slow:0.05'}}]
        devices:
          - name: {H100}
            uuid: {HELD}
            memory: {{total: 85520809984, used: 1}}
            power: {{start: 100000, step: 1000}}
            xid: {[{"sample": 3, "code": 13}] * LATE_XIDS}
          - name: {H100}
            uuid: {FREE}
            memory: {{total: 85520809984, used: 1}}
            power: {{start: 100000, step: 1000}}
    """))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, **FAST}
    proc = collector("--simulate", str(path), env=env, interval="0.25")

    def counted() -> str | None:
        text = proc.metrics()
        rows = series(text, "nvidia_gpu_xid_errors_total", hw_id=HELD, nvidia_gpu_xid="13")
        return text if rows and rows[0][1] >= LATE_XIDS else None

    text = wait_until(counted, 40, f"{LATE_XIDS} XIDs counted")
    assert series(text, "nvidia_gpu_xid_errors_total", hw_id=HELD,
                  nvidia_gpu_xid="13")[0][1] == LATE_XIDS
    records = receiver.wait_for_logs(lambda r: r.event_name == "nvidia.gpu.xid", timeout=30,
                                     count=LATE_XIDS)
    assert len(records) == LATE_XIDS and all(r.attributes["hw.id"] == HELD for r in records)
    ages = {lab["hw_id"]: v for lab, v in series(text, "otel_gpu_device_sample_age_seconds")}
    assert max(ages.values()) < 1.0, ages  # no GPU waited on the drain
    late = [ln for ln in proc.lines if "nvmlEventSetWait" in ln and "has not returned" in ln]
    assert late, proc.log  # the late drain is said in the log
    assert "Traceback" not in proc.log
