"""The Pod Resources poller against a real gRPC server on a unix socket."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import grpc
import pytest

from otel_gpu._log import LogLimiter
from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
from otel_gpu.attribute.k8s.device_ids import ResourceFilter
from otel_gpu.attribute.k8s.kubelet_answer import (
    EMPTY_STATE,
    AllocatableDevice,
    Allocation,
    allocatable_from_v1,
    allocations_from_v1,
)
from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher
from otel_gpu.workload import PodRef
from testkit.kubelet import (
    V1_ALLOCATABLE,
    V1_GET,
    V1_LIST,
    V1ALPHA1_LIST,
    FakeKubelet,
    claim,
    claim_device,
    container,
    devices,
    pod,
)
from testkit.process import wait_until
from tests.support.snapshots import GPU0, GPU1, GPU2, MIG_A

LOGGER = "otel_gpu.attribute.k8s.podresources"
MiB = 1024 * 1024


def reply(*pods: v1_pb2.PodResources) -> v1_pb2.ListPodResourcesResponse:
    """A List reply as the client receives it (through the wire format)."""
    msg = v1_pb2.ListPodResourcesResponse(pod_resources=list(pods))
    return v1_pb2.ListPodResourcesResponse.FromString(msg.SerializeToString())


def watcher(kubelet: FakeKubelet, **kw) -> PodResourcesWatcher:
    kw.setdefault("timeout", 2.0)
    return PodResourcesWatcher(kubelet.socket_path, **kw)


# --------------------------------------------------------------------------- conversion


def test_numa_node_zero_is_kept_and_unset_topology_means_none() -> None:
    allocs = allocations_from_v1(
        reply(
            pod(
                "p",
                container(
                    "c",
                    devices("nvidia.com/gpu", GPU0, numa=0),
                    devices("nvidia.com/gpu", GPU1),
                    devices("nvidia.com/gpu", GPU2, numa=[]),
                ),
            )
        ),
        ResourceFilter(),
    )
    numa = {a.device_id: a.numa_nodes for a in allocs}
    assert numa == {GPU0: (0,), GPU1: (), GPU2: ()}


def test_device_repeated_per_numa_node_is_deduplicated() -> None:
    allocs = allocations_from_v1(
        reply(
            pod(
                "p",
                container(
                    "c",
                    devices("nvidia.com/gpu", GPU0, numa=1),
                    devices("nvidia.com/gpu", GPU0, GPU1, numa=0),
                    cpu_ids=[5, 3, 3],
                ),
            )
        ),
        ResourceFilter(),
    )
    assert sorted(allocs, key=lambda a: a.device_id) == [
        Allocation(PodRef("p", "default", "c"), "nvidia.com/gpu", GPU0, (0, 1), (3, 5)),
        Allocation(PodRef("p", "default", "c"), "nvidia.com/gpu", GPU1, (0,), (3, 5)),
    ]


def test_containers_without_gpus_and_finished_pods_are_ignored() -> None:
    allocs = allocations_from_v1(
        reply(
            pod("finished", container("main")),
            pod("cpu-only", container("main", cpu_ids=[1, 2])),
            pod("nic", container("main", devices("example.com/nic", "eth1"))),
            pod("empty-ids", container("main", devices("nvidia.com/gpu"))),
            pod("other-dra", container("main", claims=[claim("c", claim_device("nic-0", driver="nic.example.com"))])),  # noqa: E501
            pod("gpu", container("sidecar"), container("main", devices("nvidia.com/gpu", GPU0))),
        ),
        ResourceFilter(),
    )
    assert [(a.pod, a.container) for a in allocs] == [("gpu", "main")]


def test_extra_resource_names() -> None:
    r = reply(pod("p", container("c", devices("nvidia.com/a100", GPU0))))
    assert allocations_from_v1(r, ResourceFilter()) == ()
    assert len(allocations_from_v1(r, ResourceFilter(["nvidia.com/a100"]))) == 1


def test_dra_claims() -> None:
    allocs = allocations_from_v1(
        reply(
            pod(
                "trainer",
                container(
                    "main",
                    claims=[
                        claim(
                            "gpus",
                            claim_device("gpu-0", pool="node-a", cdi=["k8s.gpu.nvidia.com/device=gpu-0"]),  # noqa: E501
                            claim_device("gpu-1", pool="node-a", share_id="abc"),
                            namespace="ml",
                        )
                    ],
                    cpu_ids=[4],
                ),
                namespace="ml",
            )
        ),
        ResourceFilter(),
    )
    assert allocs == (
        Allocation(PodRef("trainer", "ml", "main"), "gpu.nvidia.com", "gpu-0", (), (4,),
                   "gpus", "ml", "gpu.nvidia.com", "node-a", None),
        Allocation(PodRef("trainer", "ml", "main"), "gpu.nvidia.com", "gpu-1", (), (4,),
                   "gpus", "ml", "gpu.nvidia.com", "node-a", "abc"),
    )  # fmt: skip


def test_allocatable_dedup() -> None:
    msg = v1_pb2.AllocatableResourcesResponse(
        devices=[
            devices("nvidia.com/gpu", GPU0, GPU1, numa=0),
            devices("nvidia.com/gpu", GPU0, numa=1),
            devices("example.com/nic", "eth0"),
        ]
    )
    assert allocatable_from_v1(msg, ResourceFilter()) == (
        AllocatableDevice("nvidia.com/gpu", GPU0, (0, 1)),
        AllocatableDevice("nvidia.com/gpu", GPU1, (0,)),
    )


# --------------------------------------------------------------------------- watcher basics


def test_poll_once_v1(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [
            pod("a", container("c", devices("nvidia.com/gpu", GPU0, numa=0), cpu_ids=[0, 1])),
            pod("b", container("c", devices("nvidia.com/mig-1g.5gb", MIG_A)), namespace="x"),
        ]
    )
    kubelet.set_allocatable([devices("nvidia.com/gpu", GPU0, GPU1, numa=0)])
    w = watcher(kubelet)
    assert w.state is EMPTY_STATE
    assert w.poll_once()
    st = w.state
    assert st.source == "v1"
    assert st.pod_count == 2 and st.device_count == 2
    assert {(a.namespace, a.pod, a.device_id) for a in st.allocations} == {
        ("default", "a", GPU0),
        ("x", "b", MIG_A),
    }
    assert [d.device_id for d in st.allocatable] == [GPU0, GPU1]
    assert st.taken_monotonic is not None
    stats = w.stats
    assert stats.requests == {(V1_LIST, "OK"): 1, (V1_ALLOCATABLE, "OK"): 1}
    assert stats.pods == 2 and stats.devices == 2 and stats.socket_present is True
    assert kubelet.calls[V1_GET] == 0
    w.stop()


def test_state_is_replaced_not_mutated(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
    w = watcher(kubelet)
    w.poll_once()
    first = w.state
    kubelet.set_pods([pod("b", container("c", devices("nvidia.com/gpu", GPU1)))])
    w.poll_once()
    assert [a.pod for a in first.allocations] == ["a"]
    assert [a.pod for a in w.state.allocations] == ["b"]
    with pytest.raises(AttributeError):
        w.state.allocations = ()  # type: ignore[misc]
    w.stop()


def test_allocatable_asked_every_nth_poll_and_dropped_when_unimplemented(
    kubelet: FakeKubelet,
) -> None:
    kubelet.set_allocatable([devices("nvidia.com/gpu", GPU0)])
    w = watcher(kubelet, allocatable_every=3)
    for _ in range(7):
        assert w.poll_once()
    assert kubelet.calls[V1_LIST] == 7
    assert kubelet.calls[V1_ALLOCATABLE] == 3  # polls 1, 4, 7
    assert w.state.allocatable is not None

    kubelet.allocatable_unimplemented = True
    for _ in range(10):
        assert w.poll_once()
    assert kubelet.calls[V1_ALLOCATABLE] == 4  # asked once more, then never again
    assert w.state.allocatable is None
    w.stop()


def test_allocatable_failure_keeps_last_value_and_retries_next_poll(
    kubelet: FakeKubelet,
) -> None:
    kubelet.set_allocatable([devices("nvidia.com/gpu", GPU0)])
    w = watcher(kubelet, allocatable_every=100)
    assert w.poll_once()
    kubelet.set_allocatable([devices("nvidia.com/gpu", GPU0, GPU1)])
    w.client._polls_until_allocatable = 0  # due now
    kubelet.fail_next(1, rpc=V1_ALLOCATABLE)
    assert w.poll_once()  # List itself succeeded
    assert len(w.state.allocatable) == 1
    assert w.poll_once()
    assert len(w.state.allocatable) == 2
    w.stop()


def test_v1alpha1_only_kubelet(kubelet: FakeKubelet, caplog) -> None:
    kubelet.set_v1_unimplemented()
    kubelet.set_pods(
        [
            pod("a", container("c", devices("nvidia.com/gpu", GPU0, numa=1), cpu_ids=[3])),
            pod("done", container("c")),
        ]
    )
    w = watcher(kubelet)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            assert w.poll_once()
    st = w.state
    assert st.source == "v1alpha1"
    assert st.allocatable is None
    assert st.allocations == (Allocation(PodRef("a", "default", "c"), "nvidia.com/gpu", GPU0),)
    # v1 asked once, then v1alpha1 only; the switch logged once.
    assert kubelet.calls[V1_LIST] == 1
    assert kubelet.calls[V1ALPHA1_LIST] == 3
    assert kubelet.calls[V1_ALLOCATABLE] == 0
    assert sum("v1alpha1" in r.getMessage() for r in caplog.records) == 1
    assert w.stats.requests[(V1_LIST, "UNIMPLEMENTED")] == 1
    w.stop()


# --------------------------------------------------------------------------- failures


def test_rate_limit_backoff_grows_then_resets(kubelet: FakeKubelet, clock, caplog) -> None:
    kubelet.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
    w = watcher(
        kubelet, clock=clock, random=lambda: 1.0, backoff_base=1.0, backoff_cap=8.0,
        grace_period=1e9, log_interval=300.0,
    )  # fmt: skip
    assert w.poll_once()
    assert w.next_delay == 10.0
    kubelet.fail_next(6)
    delays = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(6):
            assert not w.poll_once()
            delays.append(w.next_delay)
            clock.advance(w.next_delay)
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert w.stats.consecutive_failures == 6
    assert w.stats.requests[(V1_LIST, "RESOURCE_EXHAUSTED")] == 6
    # Rate-limited logging: the first failure logged, repeats within 300 s suppressed.
    failures = [r for r in caplog.records if "RESOURCE_EXHAUSTED" in r.getMessage()]
    assert len(failures) == 1 and "rejected by rate limit" in failures[0].getMessage()
    # The state survived (grace period), and success resets everything.
    assert w.state.pod_count == 1
    assert w.poll_once()
    assert w.next_delay == 10.0
    assert w.stats.consecutive_failures == 0
    kubelet.fail_next(1, grpc.StatusCode.UNAVAILABLE, "connection refused")
    assert not w.poll_once()
    assert w.next_delay == 1.0
    w.stop()


def test_backoff_uses_full_jitter(kubelet: FakeKubelet, clock) -> None:
    draws = iter([0.5, 0.25, 0.0, 0.75])
    w = watcher(kubelet, clock=clock, random=lambda: next(draws), grace_period=1e9)
    kubelet.fail_next(4)
    delays = []
    for _ in range(4):
        w.poll_once()
        delays.append(w.next_delay)
    assert delays == [0.5, 0.5, 0.01, 6.0]  # 0.5*1, 0.25*2, floor, 0.75*8
    w.stop()


def test_backoff_with_thread_recovers(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
    kubelet.fail_next(4)
    w = watcher(kubelet, interval=0.05, backoff_base=0.02, backoff_cap=0.1)
    w.start()
    try:
        assert wait_until(lambda: w.state.pod_count == 1, timeout=10)
        assert w.stats.requests[(V1_LIST, "RESOURCE_EXHAUSTED")] == 4
    finally:
        w.stop()


def test_deadline_on_every_call(kubelet: FakeKubelet) -> None:
    kubelet.list_delay = 1.5
    w = watcher(kubelet, timeout=0.2)
    t0 = time.monotonic()
    assert not w.poll_once()
    assert time.monotonic() - t0 < 1.2
    assert w.stats.requests[(V1_LIST, "DEADLINE_EXCEEDED")] == 1
    kubelet.list_delay = 0.0
    assert wait_until(w.poll_once, timeout=10)
    w.stop()


def test_kubelet_restart_keeps_state_for_grace_period_then_drops_it(
    kubelet: FakeKubelet, clock, caplog
) -> None:
    kubelet.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
    w = watcher(kubelet, clock=clock, grace_period=60.0, random=lambda: 1.0)
    assert w.poll_once()
    good = w.state

    kubelet.stop()  # socket removed
    assert not os.path.exists(kubelet.socket_path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        clock.advance(10)
        assert not w.poll_once()  # failures start here
        assert w.state is good  # no churn inside the grace period
        assert w.stats.pods == 1
        assert w.next_delay <= 60.0
        clock.advance(59.9)
        assert not w.poll_once()
        assert w.state is good
        clock.advance(0.2)  # 60.1 s after the first failure
        assert w.state is EMPTY_STATE  # readers see the drop even before the next poll
        assert not w.poll_once()
        assert not w.poll_once()
        assert w.state is EMPTY_STATE
        assert w.stats.pods == 0
        drops = [r for r in caplog.records if "dropping pod attribution" in r.getMessage()]
        assert len(drops) == 1

        kubelet.set_pods([pod("b", container("c", devices("nvidia.com/gpu", GPU1)))])
        kubelet.start()  # same path, new server
        assert w.poll_once()
    assert [a.pod for a in w.state.allocations] == ["b"]
    assert w.stats.last_success_monotonic == clock.now
    w.stop()


def test_quick_kubelet_restart_with_long_lived_channel(kubelet: FakeKubelet, clock) -> None:
    kubelet.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
    w = watcher(kubelet, clock=clock)
    assert w.poll_once()
    for i in range(3):
        kubelet.set_pods([pod(f"p{i}", container("c", devices("nvidia.com/gpu", GPU0)))])
        kubelet.restart()  # removed and recreated between two polls
        # The first call on the old connection may fail UNAVAILABLE; the next must work.
        assert w.poll_once() or w.poll_once()
        assert [a.pod for a in w.state.allocations] == [f"p{i}"]
    w.stop()


def test_restart_with_thread_running_recovers_by_itself(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
    w = watcher(kubelet, interval=0.05, backoff_base=0.02, backoff_cap=0.1, grace_period=30)
    w.start()
    try:
        assert wait_until(lambda: w.state.pod_count == 1)
        kubelet.stop()
        assert wait_until(lambda: w.stats.socket_present is False)
        assert w.state.pod_count == 1  # kept for the grace period
        kubelet.set_pods([pod("b", container("c", devices("nvidia.com/gpu", GPU1)))])
        kubelet.start()
        assert wait_until(lambda: [a.pod for a in w.state.allocations] == ["b"])
    finally:
        w.stop()


def test_socket_absent_at_start_then_appears(caplog) -> None:
    fake = FakeKubelet()  # not started: no socket yet
    try:
        fake.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
        w = watcher(fake, interval=0.05)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            for _ in range(5):
                assert not w.poll_once()
            assert w.state is EMPTY_STATE
            assert w.next_delay == 0.05  # cheap stat() each interval, no backoff needed
            absent = [r for r in caplog.records if fake.socket_path in r.getMessage()]
            assert len(absent) == 1
            # not a Kubernetes node, most likely: one INFO line, nothing louder
            assert absent[0].levelno == logging.INFO
            assert absent[0].getMessage().startswith(
                f"pod attribution off: no kubelet socket at {fake.socket_path} ")
            assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []

            w.start()
            fake.start()
            assert wait_until(lambda: w.state.pod_count == 1)
        assert any("available" in r.getMessage() for r in caplog.records)
        w.stop()
    finally:
        fake.close()


def test_stale_socket_file_without_listener(caplog) -> None:
    fake = FakeKubelet()
    try:
        # A socket file nobody listens on, as a crashed kubelet leaves behind.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(fake.socket_path)
        s.close()
        w = watcher(fake, random=lambda: 1.0)
        t0 = time.monotonic()
        assert not w.poll_once()
        assert time.monotonic() - t0 < 2.0
        assert w.stats.requests[(V1_LIST, "UNAVAILABLE")] == 1
        fake.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
        fake.start()  # replaces the stale file
        assert w.poll_once()
        assert w.state.pod_count == 1
        w.stop()
    finally:
        fake.close()


def test_path_that_is_not_a_socket(tmp_path, caplog) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("")  # a directory is said to be one (test_enrich)
    w = PodResourcesWatcher(path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert not w.poll_once()
        assert not w.poll_once()
    lines = [r for r in caplog.records if "not a socket" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.WARNING  # something is there, but wrong: say so louder
    assert w.stats.socket_present is False


def test_unexpected_error_in_poll_does_not_kill_the_thread(kubelet: FakeKubelet, caplog) -> None:
    kubelet.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
    w = watcher(kubelet, interval=0.05, backoff_base=0.02, backoff_cap=0.05)
    real = w.accept
    broken = {"left": 2}

    class Flaky:
        def accepts_resource(self, name: str) -> bool:
            if broken["left"]:
                broken["left"] -= 1
                raise RuntimeError("bug")
            return real.accepts_resource(name)

        def accepts_driver(self, name: str) -> bool:
            return real.accepts_driver(name)

    w.accept = Flaky()  # type: ignore[assignment]
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        w.start()
        try:
            assert wait_until(lambda: w.state.pod_count == 1)
        finally:
            w.stop()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None  # second one rate-limited


def test_stop_is_prompt_even_during_a_call(kubelet: FakeKubelet) -> None:
    kubelet.list_delay = 3.0
    w = watcher(kubelet, timeout=5.0)
    w.start()
    assert kubelet.wait_for_calls(V1_LIST, 1)
    thread = w.thread
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 1.0
    assert thread is not None and not thread.is_alive()
    assert thread.daemon


def test_stop_is_prompt_while_waiting(kubelet: FakeKubelet) -> None:
    w = watcher(kubelet, interval=3600)
    w.start()
    assert kubelet.wait_for_calls(V1_LIST, 1)
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 1.0
    assert kubelet.calls[V1_LIST] == 1


def test_concurrent_state_reads_never_call_the_kubelet(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod(f"p{i}", container("c", devices("nvidia.com/gpu", GPU0))) for i in range(50)])  # noqa: E501
    w = watcher(kubelet)
    assert w.poll_once()
    kubelet.reset_calls()
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            n = 0
            for _ in range(2000):
                n += w.state.pod_count
                n += w.stats.pods
            seen.append(n)
        except BaseException as e:  # noqa: BLE001 - reported below  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert seen == [2000 * 100] * 16
    assert kubelet.total_calls() == 0
    w.stop()


# --------------------------------------------------------------------------- big replies


def _many_pods(n: int, per_pod_ids: int) -> list[v1_pb2.PodResources]:
    pods = []
    for i in range(n):
        ids = [f"GPU-{i:08x}-{j:04x}-0000-0000-000000000000::{j}" for j in range(per_pod_ids)]
        pods.append(
            pod(
                f"worker-{i:06d}-abcdefghij",
                container("main", devices("nvidia.com/gpu", *ids, numa=i % 2), cpu_ids=[i % 64]),
                container("sidecar"),
                namespace=f"team-{i % 40:03d}",
            )
        )
    return pods


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
@pytest.mark.parametrize(("pods", "ids", "min_mib"), [(6000, 16, 4.0), (7000, 15, 5.0)])
def test_large_list_reply(kubelet: FakeKubelet, pods: int, ids: int, min_mib: float) -> None:
    data = _many_pods(pods, ids)
    size = v1_pb2.ListPodResourcesResponse(pod_resources=data).ByteSize()
    assert size > min_mib * MiB
    kubelet.set_pods(data)
    w = watcher(kubelet, timeout=20.0)
    assert w.poll_once(), w.stats.requests
    assert w.state.pod_count == pods
    assert len(w.state.allocations) == pods * ids
    w.stop()


def test_reply_over_receive_limit_is_resource_exhausted(kubelet: FakeKubelet, caplog) -> None:
    kubelet.set_pods(_many_pods(6000, 16))
    w = watcher(kubelet, max_message_bytes=4 * MiB, timeout=20.0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not w.poll_once()
    assert w.stats.requests[(V1_LIST, "RESOURCE_EXHAUSTED")] == 1
    assert any("max_message_bytes" in r.getMessage() for r in caplog.records)
    w.stop()


def test_rejects_silly_parameters(tmp_path) -> None:
    with pytest.raises(ValueError):
        PodResourcesWatcher(tmp_path / "s", max_message_bytes=1024)
    with pytest.raises(ValueError):
        PodResourcesWatcher(tmp_path / "s", interval=0)


# --------------------------------------------------------------------------- log limiter


def test_log_limiter(caplog, clock) -> None:
    logger = logging.getLogger("test.limiter")
    limiter = LogLimiter(logger, 60.0, clock=clock, max_keys=2)
    with caplog.at_level(logging.INFO, logger="test.limiter"):
        assert limiter.log("k", logging.WARNING, "failed %s", "x")
        for _ in range(5):
            clock.advance(1)
            assert not limiter.log("k", logging.WARNING, "failed %s", "x")
        clock.advance(60)
        assert limiter.log("k", logging.WARNING, "failed %s", "x")
        assert limiter.once("o", logging.INFO, "first")
        assert not limiter.once("o", logging.INFO, "first")
        for key in ("a", "b", "c"):  # bounded: "o" is forgotten
            limiter.once(key, logging.INFO, key)
        assert limiter.once("o", logging.INFO, "first")
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:3] == ["failed x", "failed x (5 similar messages suppressed)", "first"]


def test_on_update_is_called_when_the_allocations_change(kubelet):
    seen = []
    kubelet.set_pods([pod("a", container("main", devices("nvidia.com/gpu", GPU0)))])
    watcher = PodResourcesWatcher(kubelet.socket_path, on_update=seen.append)
    try:
        assert watcher.poll_once()
        assert watcher.poll_once()  # same answer: no second call
        assert [s.allocations[0].pod for s in seen] == ["a"]
        kubelet.set_pods([pod("b", container("main", devices("nvidia.com/gpu", GPU0)))])
        assert watcher.poll_once()
        assert [s.allocations[0].pod for s in seen] == ["a", "b"]
    finally:
        watcher.stop()


@pytest.mark.parametrize("rpc", [V1_LIST, V1_ALLOCATABLE])
def test_corrupt_reply_is_one_line_and_keeps_the_pods_for_the_grace_period(
    kubelet: FakeKubelet, clock, caplog, rpc: str
) -> None:
    kubelet.set_pods([pod("a", container("c", devices("nvidia.com/gpu", GPU0)))])
    kubelet.set_allocatable([devices("nvidia.com/gpu", GPU0)])
    w = watcher(kubelet, clock=clock, grace_period=60.0, random=lambda: 1.0,
                allocatable_every=1)
    assert w.poll_once()
    good = w.state
    kubelet.corrupt_next(3, rpc=rpc)
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            clock.advance(1)
            ok = w.poll_once()
            assert ok is (rpc == V1_ALLOCATABLE)  # a bad allocatable keeps the last one
            assert w.state.allocations == good.allocations
            assert w.state.allocatable == good.allocatable
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    lines = [r for r in caplog.records if "not a valid" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0].name == LOGGER and rpc in lines[0].getMessage()
    if rpc == V1_LIST:
        assert w.stats.consecutive_failures == 3
        clock.advance(60)
        kubelet.corrupt_next(1, rpc=rpc)
        assert not w.poll_once()
        assert w.state is EMPTY_STATE  # then dropped, as for any failed poll
    assert w.poll_once()  # and back once the kubelet speaks protobuf again
    assert [a.pod for a in w.state.allocations] == ["a"]
    w.stop()
