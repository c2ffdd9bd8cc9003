"""The attribution stage: pods joined to each snapshot, and unmatched ids summarised."""

from __future__ import annotations

import gc
import logging
import tracemalloc

import pytest

from otel_gpu.attribute.k8s.enrich import PodEnricher
from otel_gpu.attribute.k8s.kubelet_answer import Allocation, PodResourcesState
from otel_gpu.workload import PodRef
from testkit.kubelet import FakePodSource
from tests.support.clock import FakeClock
from tests.support.snapshots import GPU0, gpu_device, sample, snapshot

LOGGER = "otel_gpu.attribute.k8s.enrich"
WATCHER = "otel_gpu.attribute.k8s.podresources"
"""The kubelet watcher's lines (the socket's presence) are its own module's."""


def _state(*allocations: Allocation) -> PodResourcesState:
    return PodResourcesState(tuple(allocations), None, 1.0, "v1")


def _unknown(pods: int, per_pod: int = 4, tag: str = "x") -> PodResourcesState:
    """``pods`` pods holding ``per_pod`` ids each that match no GPU of the node."""
    return _state(*(
        Allocation(PodRef(f"p{i}", "ml", "main"), "nvidia.com/gpu", f"GPU-{tag}-{i:05d}-{k}")
        for i in range(pods) for k in range(per_pod)
    ))


def _held(pod: str = "train") -> PodResourcesState:
    return _state(Allocation(PodRef(pod, "ml", "main"), "nvidia.com/gpu", GPU0))


@pytest.fixture
def node():
    return snapshot(sample(gpu_device(GPU0)))


def _lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def test_pods_are_attached_and_unmatched_ids_counted(node, tmp_path):
    watcher = FakePodSource(state=_held())
    enrich = PodEnricher(watcher, tmp_path)
    joined = enrich.process(node)
    assert joined.series_pods(GPU0)[0].pod == "train"
    assert joined.pods.attribution.unresolved == ()
    watcher.state = _state(*_held().allocations, *_unknown(2, 2).allocations)
    assert len(enrich.process(node).pods.attribution.unresolved) == 4


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_thousands_of_unmatched_ids_make_one_line(node, tmp_path, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    watcher = FakePodSource(state=_unknown(5000))
    enrich = PodEnricher(watcher, tmp_path)
    enrich.process(node)
    (line,) = _lines(caplog)
    assert line.levelno == logging.WARNING
    message = line.getMessage()
    assert "20000 allocated device id(s)" in message
    assert message.count("GPU-x-") == 3  # a few examples, not the list
    assert "(unknown device id format)" in message
    # the same answer polled again (a new state object) and more samples: nothing more
    for _ in range(5):
        watcher.state = _unknown(5000)
        enrich.process(node)
    assert len(_lines(caplog)) == 1


def test_changes_inside_the_window_are_summarised_when_it_ends(node, tmp_path, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    clock = FakeClock()
    watcher = FakePodSource(state=_unknown(10))
    enrich = PodEnricher(watcher, tmp_path, clock=clock)
    enrich.process(node)
    assert len(_lines(caplog)) == 1
    for tag, pods in (("y", 20), ("z", 30)):
        clock.advance(10)
        watcher.state = _unknown(pods, tag=tag)
        enrich.process(node)
    assert len(_lines(caplog)) == 1  # held back: a minute has not passed
    clock.advance(41)  # 61 s after the first line: the next sample reports the set as it is
    enrich.process(node)
    lines = _lines(caplog)
    assert len(lines) == 2
    assert "120 allocated device id(s)" in lines[1].getMessage()
    assert "GPU-z-" in lines[1].getMessage()
    assert "the set changed 2 times since the last such line" in lines[1].getMessage()
    clock.advance(600)
    enrich.process(node)  # unchanged: silent however long it lasts
    assert len(_lines(caplog)) == 2


def test_every_id_matching_again_is_said_once(node, tmp_path, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    clock = FakeClock()
    watcher = FakePodSource(state=_unknown(3))
    enrich = PodEnricher(watcher, tmp_path, clock=clock)
    enrich.process(node)
    clock.advance(61)
    watcher.state = _held()
    enrich.process(node)
    enrich.process(node)
    lines = _lines(caplog)
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO]
    assert "matches a device on this node again" in lines[1].getMessage()


def test_nothing_is_said_while_every_id_matches(node, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, LOGGER)
    enrich = PodEnricher(FakePodSource(state=_held()), tmp_path)
    for _ in range(3):
        enrich.process(node)
    assert _lines(caplog) == []


def test_memory_stays_flat_whatever_the_number_of_distinct_ids(node, tmp_path):
    """Nothing is kept per id: 20 answers of 1,000 new ids each leave a few bytes behind."""
    logging.getLogger(LOGGER).disabled = True
    try:
        clock = FakeClock()
        watcher = FakePodSource(state=_unknown(1))
        enrich = PodEnricher(watcher, tmp_path, clock=clock)
        enrich.process(node)
        watcher.state = _held()
        enrich.process(node)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for round_ in range(20):
            clock.advance(61)
            watcher.state = _unknown(250, tag=f"r{round_}")
            enrich.process(node)
        watcher.state = _held()
        enrich.process(node)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    finally:
        logging.getLogger(LOGGER).disabled = False
    assert kept < 64 * 1024, kept


def test_the_real_sources_and_the_double_are_pod_sources(tmp_path):
    from otel_gpu.attribute.enrich import Enricher
    from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher
    from otel_gpu.attribute.k8s.source import PodSource

    path = tmp_path / "kubelet.sock"
    real = PodResourcesWatcher(path)
    waiting = PodResourcesWatcher(path, interval=1.0, initial=None)  # the collector's
    for source in (real, waiting, FakePodSource()):
        assert isinstance(source, PodSource), source
    assert waiting.state is None and not waiting.poll_once()  # no socket: nothing yet
    assert isinstance(PodEnricher(waiting, tmp_path), Enricher)


def test_the_watcher_connects_once_a_socket_is_there_and_retries_a_failed_connect(
        tmp_path, caplog, monkeypatch):
    """Absent: one line, no client (no gRPC); a client that fails to build (a bug) is one
    error line and tried again after a backoff; once built, it is asked."""
    import socket

    from otel_gpu.attribute.k8s import kubelet_rpc
    from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher
    from testkit.process import wait_until

    path = tmp_path / "kubelet.sock"
    tries = []

    class Client:
        def __init__(self, *args: object) -> None:
            tries.append(1)
            if len(tries) < 3:
                raise RuntimeError("bug")

        def ask(self) -> PodResourcesState:
            return _held()

        def close(self) -> None:
            pass

    monkeypatch.setattr(kubelet_rpc, "PodResourcesClient", Client)
    waiting = PodResourcesWatcher(path, interval=0.01, backoff_base=0.01, backoff_cap=0.02,
                                  initial=None)
    with caplog.at_level(logging.INFO, logger=WATCHER):
        waiting.start()
        try:
            assert wait_until(lambda: waiting.stats.socket_present is False, 10, "a look")
            assert waiting.client is None
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(str(path))
                assert wait_until(lambda: waiting.stats.pods == 1, 10, "the answer")
                waiting.stop()
        finally:
            waiting.stop()
    assert isinstance(waiting.client, Client) and len(tries) == 3
    lines = [r for r in caplog.records if r.name == WATCHER]
    # No socket at the start: no polling line, only the absence; the socket's line comes as
    # it appears, before the client is built; the failed builds are failed polls, so the
    # first answer says it ends them.
    assert [r.levelno for r in lines] == [logging.INFO, logging.INFO, logging.ERROR, logging.INFO]
    assert lines[0].getMessage().startswith(f"pod attribution off: no kubelet socket at {path}")
    assert lines[1].getMessage().endswith("is available: pod attribution on")
    assert lines[2].exc_info is not None
    assert lines[3].getMessage().endswith("answers again after 2 failed attempts")


def _waiting(path, clock, **kw):
    """The collector's watcher, at a path without a socket (no client is ever built)."""
    from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher

    return PodResourcesWatcher(path, interval=10.0, grace_period=60.0, clock=clock,
                               initial=None, **kw)


def test_a_socket_absent_past_the_grace_period_is_warned_of_and_said_in_readiness(
        tmp_path, caplog):
    """A mistyped kubelet_socket: one INFO line at first, then a WARNING once the grace period
    is over, repeated at most every ``absent_every``; ``problem`` (what /readyz adds) is None
    within the grace period and names the path and how long after it."""
    clock = FakeClock()
    path = tmp_path / "kubelet.sokc"
    waiting = _waiting(path, clock, absent_every=600.0)
    enrich = PodEnricher(waiting, tmp_path)
    with caplog.at_level(logging.INFO, logger=WATCHER):
        for _ in range(6):  # the waiting thread's looks, one per interval, within the grace
            assert not waiting.poll_once()
            assert enrich.problem() is None
            clock.advance(10.0)
        for _ in range(60 * 6):  # an hour of looks past the grace period
            assert not waiting.poll_once()
            clock.advance(10.0)
    lines = [r for r in caplog.records if r.name == WATCHER]
    assert lines[0].levelno == logging.INFO
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    assert len(warnings) == 6, warnings  # one per 10 min over the hour
    assert warnings[0].startswith(f"pod attribution off: still no kubelet socket at {path} "
                                  "after 60 s (kubelet_socket mistyped"), warnings[0]
    assert enrich.problem() == f"no kubelet socket at {path} for 61 min"


def test_a_directory_is_said_to_be_one_not_told_to_be_mounted(tmp_path, caplog):
    import socket

    clock = FakeClock()
    directory = tmp_path / "pod-resources"
    directory.mkdir()
    waiting = _waiting(directory, clock)
    with caplog.at_level(logging.INFO, logger=WATCHER):
        assert not waiting.poll_once()
        assert not waiting.poll_once()
    (line,) = [r for r in caplog.records if r.name == WATCHER]
    assert line.levelno == logging.WARNING
    text = line.getMessage()
    assert text.startswith(f"kubelet_socket {directory} is a directory, not the kubelet's "
                           "pod-resources socket"), text
    assert "mount" not in text and "none there now" in text
    assert waiting.problem() == f"kubelet_socket {directory} is a directory, not the socket"
    # With the socket inside, the line names it.
    caplog.clear()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(directory / "kubelet.sock"))
        with caplog.at_level(logging.INFO, logger=WATCHER):
            assert not _waiting(directory, clock).poll_once()
    (line,) = [r for r in caplog.records if r.name == WATCHER]
    assert f"({directory / 'kubelet.sock'} is there)" in line.getMessage()
