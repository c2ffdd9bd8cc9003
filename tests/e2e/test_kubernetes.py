"""The real otel-gpu process in simulation, attributing GPUs through a fake kubelet."""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from otel_gpu import sim
from testkit.exposition import series
from testkit.kubelet import FakeKubelet, container, devices, pod
from testkit.process import run_cli, wait_until
from tests.support.nvml import profile_uuids

H100 = profile_uuids("h100x8")
A100 = sim.load_scenario("a100-mig").devices
POD_LABELS = ("k8s_pod_name", "k8s_namespace_name", "k8s_container_name")


def _start(collector, kubelet_socket: str, *extra: str, profile: str = "h100x8"):
    return collector(
        "--simulate", profile, "--kubelet-socket", kubelet_socket,
        "--kubelet-interval", "0.1", *extra,
    )


def _owners(text: str, metric: str = "hw_power_watts") -> dict[str, tuple | None]:
    """hw_id -> (pod, namespace, container), or None for a series with no pod labels.

    A device without a ``metric`` series is absent (not None): a device with no owner
    still has its series.
    """
    out: dict[str, tuple | None] = {}
    for labels, _ in series(text, metric):
        pod_labels = tuple(labels.get(k) for k in POD_LABELS)
        assert labels["hw_id"] not in out, f"two {metric} series for {labels['hw_id']}"
        out[labels["hw_id"]] = pod_labels if any(pod_labels) else None
    return out


def _four_pods() -> list:
    return [
        pod(f"train-{i}", container("main", devices("nvidia.com/gpu", H100[i], numa=0)),
            namespace="ml")
        for i in range(4)
    ]


def _wait_owners(proc, expected: dict, metric: str = "hw_power_watts") -> str:
    """Wait until each device in ``expected`` has its ``metric`` series with those pod
    labels (None: the series, without pod labels); a missing series never matches.
    """
    def matches():
        text = proc.metrics()
        owners = _owners(text, metric)
        return text if all(k in owners and owners[k] == v for k, v in expected.items()) else None

    return wait_until(matches, 20, f"{metric} series with pod labels {expected}")


def test_exclusive_gpus_carry_their_pods_and_free_ones_none(collector, kubelet):
    kubelet.set_pods(_four_pods())
    proc = _start(collector, kubelet.socket_path)
    expected = {H100[i]: (f"train-{i}", "ml", "main") for i in range(4)}
    expected.update({H100[i]: None for i in range(4, 8)})
    text = _wait_owners(proc, expected)
    # every device metric of an owned GPU carries the pod, not only power
    temperatures = series(text, "hw_temperature_celsius", hw_id=H100[2])
    assert temperatures
    for labels, _ in temperatures:
        assert labels["k8s_pod_name"] == "train-2"
    rows = series(text, "nvidia_gpu_k8s_allocation")
    assert sorted(lab["hw_id"] for lab, _ in rows) == sorted(H100[:4])
    assert series(text, "otel_gpu_kubelet_pods")[0][1] == 4
    assert series(text, "otel_gpu_kubelet_devices")[0][1] == 4
    assert series(text, "otel_gpu_kubelet_requests_total", rpc_method="v1/List",
                  rpc_grpc_status_code="OK")


def test_time_slicing_gives_allocation_series_not_copies(collector, kubelet):
    kubelet.set_pods([
        pod(f"infer-{i}", container("srv", devices("nvidia.com/gpu", f"{H100[0]}::{i}")))
        for i in range(3)
    ])
    proc = _start(collector, kubelet.socket_path)

    def three_rows():
        text = proc.metrics()
        return text if len(series(text, "nvidia_gpu_k8s_allocation", hw_id=H100[0])) == 3 else None

    text = wait_until(three_rows, 20, "three allocation series")
    rows = series(text, "nvidia_gpu_k8s_allocation", hw_id=H100[0])
    assert sorted(lab["k8s_pod_name"] for lab, _ in rows) == ["infer-0", "infer-1", "infer-2"]
    assert sorted(lab["nvidia_gpu_k8s_replica"] for lab, _ in rows) == ["0", "1", "2"]
    assert all(value == 1.0 for _, value in rows)
    for metric in ("hw_power_watts", "hw_gpu_memory_usage_bytes", "hw_energy_joules_total"):
        own = series(text, metric, hw_id=H100[0])
        assert len(own) == 1, metric
        assert "k8s_pod_name" not in own[0][0], metric


def test_mig_instances_carry_their_pods(collector, kubelet):
    gpu0 = A100[0]
    migs = {m.profile + str(m.gpu_instance_id): m.uuid for m in gpu0.mig}
    kubelet.set_pods([
        pod("big", container("main", devices("nvidia.com/mig-3g.20gb", migs["3g.20gb1"]))),
        pod("small", container("main", devices("nvidia.com/mig-1g.5gb", migs["1g.5gb13"]))),
        pod("whole", container("main", devices("nvidia.com/gpu", A100[1].uuid))),
    ])
    proc = _start(collector, kubelet.socket_path, profile="a100-mig")
    expected = {
        migs["3g.20gb1"]: ("big", "default", "main"),
        migs["1g.5gb13"]: ("small", "default", "main"),
        migs["1g.5gb14"]: None,
        gpu0.uuid: None,  # the parent of MIG instances carries no pod
        A100[1].uuid: ("whole", "default", "main"),
    }
    text = _wait_owners(proc, expected, metric="hw_gpu_memory_usage_bytes")
    assert _owners(text, "hw_gpu_memory_usage_bytes")[migs["3g.20gb1"]] == ("big", "default",
                                                                           "main")


@pytest.mark.slow  # waits out the kubelet's absence and the collector's retries
def test_kubelet_restart_keeps_labels_and_recovers(collector, kubelet):
    kubelet.set_pods(_four_pods())
    proc = _start(collector, kubelet.socket_path, "--kubelet-grace-period", "60s")
    expected = {H100[0]: ("train-0", "ml", "main")}
    _wait_owners(proc, expected)
    kubelet.stop()
    # down for a while, inside the grace period: labels unchanged over several samples
    seq = series(proc.metrics(), "otel_gpu_samples_total")[0][1]
    text = proc.wait_sample(seq + 5)
    assert _owners(text)[H100[0]] == ("train-0", "ml", "main")
    assert not os.path.exists(kubelet.socket_path)
    # back on the same path, with a change the collector must pick up by itself
    kubelet.set_pods([pod("next", container("main", devices("nvidia.com/gpu", H100[0])))])
    kubelet.start()
    _wait_owners(proc, {H100[0]: ("next", "default", "main"), H100[1]: None})


@pytest.mark.slow  # waits out the kubelet's absence and the collector's retries
def test_grace_period_expiry_drops_labels(collector, kubelet):
    kubelet.set_pods(_four_pods())
    proc = _start(collector, kubelet.socket_path, "--kubelet-grace-period", "0.5s")
    _wait_owners(proc, {H100[0]: ("train-0", "ml", "main")})
    kubelet.stop()
    text = _wait_owners(proc, {H100[i]: None for i in range(4)})
    assert set(_owners(text)) == set(H100)  # labels dropped, series kept
    assert series(text, "nvidia_gpu_k8s_allocation") == []


@pytest.mark.slow  # waits out the kubelet's absence and the collector's retries
def test_socket_absent_at_start_then_appears(collector):
    directory = tempfile.mkdtemp(dir="/tmp", prefix="kl")
    path = os.path.join(directory, "kubelet.sock")
    proc = _start(collector, path)
    text = proc.wait_sample(3)
    assert _owners(text)[H100[0]] is None
    later = FakeKubelet(path)
    later.set_pods(_four_pods())
    later.start()
    try:
        _wait_owners(proc, {H100[3]: ("train-3", "ml", "main")})
        absent = [ln for ln in proc.lines if path in ln and "no kubelet socket" in ln]
        assert len(absent) == 1, proc.log  # said once, not once per poll
        assert any(path in ln and "pod attribution on" in ln for ln in proc.lines)
    finally:
        later.close()
        if os.path.isdir(directory):
            os.rmdir(directory)


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_fifty_concurrent_scrapes_make_no_kubelet_calls(collector, kubelet):
    kubelet.set_pods(_four_pods())
    proc = collector("--simulate", "h100x8", "--kubelet-socket", kubelet.socket_path,
                     "--kubelet-interval", "1h", interval="1h")
    _wait_owners(proc, {H100[0]: ("train-0", "ml", "main")})
    before = kubelet.total_calls()
    with ThreadPoolExecutor(50) as pool:
        bodies = list(pool.map(lambda _: proc.metrics(), range(50)))
    assert all(_owners(b)[H100[1]] == ("train-1", "ml", "main") for b in bodies)
    assert kubelet.total_calls() == before


def test_attribution_can_be_turned_off(collector, kubelet):
    kubelet.set_pods(_four_pods())
    proc = _start(collector, kubelet.socket_path, "--pod-attribution", "false")
    text = proc.wait_sample(3)
    assert _owners(text)[H100[0]] is None
    assert kubelet.total_calls() == 0
    assert series(text, "nvidia_gpu_k8s_allocation") == []


@pytest.mark.parametrize("bad", ["maybe", "2"])
def test_bad_boolean_is_one_line(bad):
    code, _, err = run_cli("--simulate", "t4", "--pod-attribution", bad)
    assert code == 2 and err.strip().splitlines() == [
        f"otel-gpu: error: pod_attribution (from flag --pod-attribution): "
        f"expected true or false, got {bad!r}"
    ]


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_thousands_of_time_sliced_pods_each_keep_their_allocation_series(collector, kubelet):
    """More holders than the SDK's default cardinality limit (2,000 per metric): every pod
    still has its own series, none folded into an ``otel_metric_overflow`` series.
    """
    names = [f"slice-{i}" for i in range(2500)]
    kubelet.set_pods([
        pod(name, container("srv", devices("nvidia.com/gpu", f"{H100[i % 8]}::{i // 8}")),
            namespace="ml")
        for i, name in enumerate(names)
    ])
    proc = _start(collector, kubelet.socket_path, "--kubelet-interval", "1h")

    def every_pod():
        text = proc.metrics()
        return text if len(series(text, "nvidia_gpu_k8s_allocation")) >= len(names) else None

    text = wait_until(every_pod, 60, "2,500 allocation series")
    rows = series(text, "nvidia_gpu_k8s_allocation")
    assert sorted(lab["k8s_pod_name"] for lab, _ in rows) == sorted(names)
    assert series(text, "otel_gpu_kubelet_pods") == [({}, 2500.0)]
    assert "otel_metric_overflow" not in text
    seq = series(text, "otel_gpu_samples_total")[0][1]
    later = proc.wait_sample(seq + 3, timeout=60)
    assert len(series(later, "nvidia_gpu_k8s_allocation")) == len(names)
    assert "otel_metric_overflow" not in later


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_pods_growing_past_the_limit_keep_their_series(collector, kubelet):
    """Pods arriving after start: the collector grows its limit instead of dropping them."""
    kubelet.set_pods(_four_pods())
    proc = _start(collector, kubelet.socket_path)
    _wait_owners(proc, {H100[0]: ("train-0", "ml", "main")})
    names = [f"slice-{i}" for i in range(2500)]
    kubelet.set_pods([
        pod(name, container("srv", devices("nvidia.com/gpu", f"{H100[i % 8]}::{i // 8}")))
        for i, name in enumerate(names)
    ])

    def every_pod():
        text = proc.metrics()
        rows = series(text, "nvidia_gpu_k8s_allocation")
        return text if sorted(lab["k8s_pod_name"] for lab, _ in rows) == sorted(names) else None

    text = wait_until(every_pod, 60, "the 2,500 new pods' allocation series, and only theirs")
    assert "otel_metric_overflow" not in text

    def rebuilt():  # the new provider serves before its "rebuilt" line is written
        lines = [ln for ln in proc.lines if "outgrew" in ln or "cardinality limit" in ln]
        return lines if any("room for" in ln for ln in lines) else None

    grown = wait_until(rebuilt, 10, "the line saying the pipeline was rebuilt")
    assert len(grown) == 2, proc.log  # said, and rebuilt once with room for them all
    assert "room for" in grown[1] and int(grown[1].split("room for ")[1].split()[0]) >= 5000


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_unmatched_device_ids_are_summarised_not_logged_one_by_one(collector, kubelet):
    """5,000 pods x 4 ids that match no GPU: one summary line and a count, not 20,000 lines."""
    def unknown_pods(tag: str) -> list:
        return [
            pod(f"p{i}", container("main", devices(
                "nvidia.com/gpu", *(f"GPU-{tag}-{i:05d}-{k}" for k in range(4)))))
            for i in range(5000)
        ]

    kubelet.set_pods(unknown_pods("a"))
    proc = _start(collector, kubelet.socket_path, "--kubelet-interval", "0.5")

    def unresolved(count: float):
        def check():
            text = proc.metrics()
            return text if series(text, "otel_gpu_kubelet_unresolved_ids") == [({}, count)] \
                else None
        return check

    text = wait_until(unresolved(20000.0), 60, "20,000 unresolved ids counted")
    assert series(text, "otel_gpu_kubelet_pods") == [({}, 0.0)]
    kubelet.set_pods(unknown_pods("b")[:3000])  # a new set, inside the minute
    text = wait_until(unresolved(12000.0), 60, "12,000 unresolved ids counted")
    proc.wait_sample(series(text, "otel_gpu_samples_total")[0][1] + 3, timeout=60)
    about_ids = [ln for ln in proc.lines if "GPU-a-" in ln or "GPU-b-" in ln]
    assert len(about_ids) == 1, about_ids[:5]
    assert "20000 allocated device id(s)" in about_ids[0]
    assert "GPU-a-00000-0" in about_ids[0]


def test_a_fifo_at_a_nodes_cpulist_holds_no_gpu_and_is_named_once(collector, kubelet, tmp_path):
    """A FIFO where sysfs has a node's cpulist (read for a container's NUMA alignment) must not
    block: every GPU keeps being sampled, the pods keep their labels, one warning names the
    file, and the collector stops at once on SIGTERM."""
    node = tmp_path / "sys" / "devices" / "system" / "node" / "node0"
    node.mkdir(parents=True)
    os.mkfifo(node / "cpulist")
    kubelet.set_pods([pod("train-0", container("main", devices("nvidia.com/gpu", H100[0], numa=0),
                                               cpu_ids=[0, 1]), namespace="ml")])
    proc = _start(collector, kubelet.socket_path, "--sysfs-root", str(tmp_path))
    text = _wait_owners(proc, {H100[0]: ("train-0", "ml", "main"), H100[1]: None})
    first = series(text, "otel_gpu_samples_total")[0][1]
    text = proc.wait_sample(first + 5, timeout=10)
    assert sorted(lab["hw_id"] for lab, _ in series(text, "hw_power_watts")) == sorted(H100)
    assert _owners(text)[H100[0]] == ("train-0", "ml", "main")
    named = [ln for ln in proc.lines if str(node / "cpulist") in ln]
    assert len(named) == 1 and " WARNING " in named[0], proc.log
    code, took = proc.stop()
    assert code == 0 and took < 2.0, (code, took, proc.log)  # 0.1 s; 2.7 s with a held sampler
    assert "still running" not in proc.log and "Traceback" not in proc.log, proc.log
