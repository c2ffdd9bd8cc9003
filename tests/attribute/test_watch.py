"""The socket watcher the kubelet and the container runtime share, with a fake source.

Time and jitter are the test's (a fake clock, chosen draws); a real unix socket
file stands at the path, since presence is what the watcher looks at first.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import tempfile
import threading
import time

import pytest

from otel_gpu.attribute.loop import Loop
from otel_gpu.attribute.watch import (
    MIN_DELAY_S,
    Lines,
    Presence,
    SocketWatch,
    Unanswered,
    backoff,
    look,
)
from testkit.process import wait_until
from tests.support.sources import ScriptedFetch

LOGGER = "test.watch"
LINES = Lines(
    what="fake source",
    absent="absent %(path)s",
    back="back %(path)s",
    gone="gone %(path)s, kept %(grace).0fs",
    failed="failed %(path)s: %(reason)s; retrying in %(delay).1fs",
    dropped="dropped after %(elapsed).0fs",
    not_socket="not a socket %(path)s",
    started="started %(path)s every %(interval)g s",
)
EMPTY = "empty"


@pytest.fixture
def path():
    """A unix socket file at a short path (AF_UNIX paths are short)."""
    folder = tempfile.mkdtemp(dir="/tmp", prefix="sw")
    where = os.path.join(folder, "s.sock")
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(where)
    bound.close()
    yield where
    shutil.rmtree(folder, ignore_errors=True)


def make(path: str, source: ScriptedFetch, clock, **kw) -> SocketWatch[str | None, str]:
    kw.setdefault("random", lambda: 1.0)
    kw.setdefault("initial", EMPTY)
    return SocketWatch(path, source.fetch, lines=LINES, log=logging.getLogger(LOGGER),
                       name="otel-gpu-test-watch", empty=EMPTY, close=source.close,
                       clock=clock, **kw)


def said(caplog, level: int = logging.DEBUG) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= level]


# --------------------------------------------------------------------------- backoff


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    assert [backoff(n, 1.0, 8.0, 1.0) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]
    assert backoff(10_000, 1.0, 60.0, 1.0) == 60.0  # no overflow however long it fails


def test_backoff_is_full_jitter_within_its_bounds() -> None:
    draws = random.Random(7)
    for failures in range(1, 12):
        ceiling = min(30.0, 0.5 * 2 ** (failures - 1))
        for _ in range(200):
            delay = backoff(failures, 0.5, 30.0, draws.random())
            assert MIN_DELAY_S <= delay <= ceiling
    assert backoff(3, 1.0, 8.0, 0.0) == MIN_DELAY_S  # never a spinning loop
    assert backoff(3, 1.0, 8.0, 0.5) == 2.0


def test_the_watcher_backs_off_on_failures_and_waits_the_interval_after_success(
        path, clock) -> None:
    source = ScriptedFetch()
    draws = iter([1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 1.0])
    w = make(path, source, clock, interval=10.0, backoff_base=1.0, backoff_cap=8.0,
             random=lambda: next(draws))
    assert w.poll_once() and w.next_delay == 10.0
    source.failures = [Unanswered("no")] * 7
    delays = []
    for _ in range(7):
        assert not w.poll_once()
        delays.append(w.next_delay)
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 4.0, MIN_DELAY_S]
    assert w.poll_once() and w.next_delay == 10.0
    source.failures = [Unanswered("no")]
    assert not w.poll_once() and w.next_delay == 1.0  # a success starts the doubling over


def test_rejects_a_backoff_that_cannot_work(path, clock) -> None:
    for bad in ({"interval": 0}, {"backoff_base": 0}, {"backoff_base": 2.0, "backoff_cap": 1.0}):
        with pytest.raises(ValueError):
            make(path, ScriptedFetch(), clock, **bad)


# --------------------------------------------------------------------------- grace period


def test_the_last_state_outlives_failures_for_the_grace_period(path, clock, caplog) -> None:
    source = ScriptedFetch()
    w = make(path, source, clock, grace_period=60.0)
    assert w.poll_once() and w.state == "a"
    source.failures = [Unanswered("down")] * 4
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert not w.poll_once()  # failures start here
        clock.advance(59.9)
        assert not w.poll_once()
        assert w.state == "a"
        clock.advance(0.2)
        assert w.state == EMPTY  # readers see the drop before the next poll
        assert not w.poll_once()
        assert not w.poll_once()
        assert w.state == EMPTY
        source.answer = "b"
        assert w.poll_once() and w.state == "b"
    lines = said(caplog)
    assert [m for m in lines if m.startswith("dropped")] == ["dropped after 60s"]  # once
    assert lines[-1] == f"fake source at {path} answers again after 4 failed attempts"


def test_a_missing_socket_keeps_the_state_for_the_grace_period_unless_off_without_it(
        path, clock) -> None:
    source = ScriptedFetch()
    kept = make(path, source, clock, grace_period=60.0)
    off = make(path, source, clock, grace_period=60.0, initial=None, off_without_socket=True)
    assert off.state is None  # nothing asked yet
    assert kept.poll_once() and off.poll_once()
    os.unlink(path)
    closed = source.closed
    assert not kept.poll_once() and not off.poll_once()
    assert source.closed == closed + 2  # the connection goes with the socket
    assert kept.state == "a" and off.state is None
    assert kept.next_delay == 10.0 and kept.failures == 0  # no backoff: a stat is cheap
    clock.advance(60)
    assert kept.state == EMPTY


def test_a_source_there_but_never_answering_publishes_empty(path, clock) -> None:
    source = ScriptedFetch()
    source.failures = [Unanswered("refused")]
    w = make(path, source, clock, initial=None, off_without_socket=True)
    assert not w.poll_once()
    assert w.state == EMPTY  # not None: the source is there, its names are unknown


def test_a_socket_there_at_the_start_is_empty_before_the_first_answer(
        path, clock, caplog) -> None:
    """start() looks before its thread asks: a stage reading the state for the first sample
    finds the source there (empty), not ``initial``, however long the first call takes."""
    entered, release = threading.Event(), threading.Event()
    source = ScriptedFetch()
    answer = source.fetch

    def held() -> str:
        entered.set()
        release.wait(10)
        return answer()

    source.fetch = held  # type: ignore[method-assign]
    w = make(path, source, clock, initial=None, interval=3600)
    w.start()
    try:
        assert w.state == EMPTY  # at once, on start's own look
        assert entered.wait(10) and w.state == EMPTY
        release.set()
        assert wait_until(lambda: w.state == "a", 10, "the answer")
    finally:
        release.set()
        w.stop()
    os.unlink(path)
    absent = make(path, ScriptedFetch(), clock, initial=None, interval=3600)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        absent.start()
        absent.stop()
    assert absent.state is None  # nothing there: nothing to join
    assert said(caplog) == [f"absent {path}"]  # no polling line without a socket


# --------------------------------------------------------------------------- lines


def test_presence_is_said_once_per_change_and_a_flapping_socket_rate_limited(
        path, clock, caplog) -> None:
    source = ScriptedFetch()
    os.unlink(path)
    w = make(path, source, clock, log_interval=60.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            assert not w.poll_once()
        assert said(caplog) == [f"absent {path}"]
        bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound.bind(path)
        bound.close()
        for _ in range(3):
            assert w.poll_once()
        assert said(caplog)[1:] == [f"back {path}"]
        for _ in range(3):  # gone and back three times within a minute
            os.rename(path, path + ".away")
            assert not w.poll_once()
            os.rename(path + ".away", path)
            assert w.poll_once()
            clock.advance(10)
        assert said(caplog)[2:] == [f"gone {path}, kept 60s", f"back {path}"]
        clock.advance(60)
        os.unlink(path)
        assert not w.poll_once()
    assert said(caplog)[4:] == [f"gone {path}, kept 60s (2 similar messages suppressed)"]
    assert w.socket_present is False


def test_something_that_is_not_a_socket_is_said_louder(tmp_path, clock, caplog) -> None:
    folder = tmp_path / "s.sock"
    folder.mkdir()  # what a bind mount of a missing socket makes
    assert look(str(folder)) is Presence.NOT_SOCKET
    assert look(str(tmp_path / "none")) is Presence.ABSENT
    w = make(str(folder), ScriptedFetch(), clock)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert not w.poll_once() and not w.poll_once()
    assert said(caplog, logging.WARNING) == [f"not a socket {folder}"]
    assert w.socket_present is False


def test_each_kind_of_failure_is_one_line_per_log_interval(path, clock, caplog) -> None:
    source = ScriptedFetch()
    w = make(path, source, clock, log_interval=60.0)
    source.failures = [Unanswered("timed out", "slow"), Unanswered("timed out", "slow"),
                       Unanswered("HTTP 500", "http"), Unanswered("timed out", "slow")]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(4):
            clock.advance(1)
            assert not w.poll_once()
    assert said(caplog, logging.WARNING) == [
        f"failed {path}: timed out; retrying in 1.0s", f"failed {path}: HTTP 500; retrying in 4.0s"]


def test_counters(path, clock) -> None:
    source = ScriptedFetch()
    w = make(path, source, clock)
    source.count = w.count
    assert w.socket_present is None and w.last_success is None and w.requests == {}
    assert w.poll_once()
    taken = clock.now
    source.failures = [Unanswered("no")] * 2
    clock.advance(5)
    assert not w.poll_once() and not w.poll_once()
    assert w.failures == 2 and w.last_success == taken
    assert w.requests == {"ok": 1, "error": 2}
    clock.advance(5)
    assert w.poll_once()
    assert w.failures == 0 and w.last_success == clock.now and w.socket_present is True
    assert w.requests == {"ok": 2, "error": 2}
    counted = w.requests
    w.count("ok")
    assert counted["ok"] == 2  # a copy: the reader's view does not move under it


def test_start_is_idempotent_and_said_once(path, clock, caplog) -> None:
    source = ScriptedFetch()
    w = make(path, source, clock, interval=3600)
    source.count = w.count
    with caplog.at_level(logging.INFO, logger=LOGGER):
        w.start()
        first = w.thread
        w.start()
        assert w.thread is first
        assert wait_until(lambda: w.requests.get("ok") == 1, 10, "the first poll")
        w.stop()
    assert said(caplog) == [f"started {path} every 3600 s"]


# --------------------------------------------------------------------------- on_update


def test_on_update_hears_only_of_changed_answers(path, clock) -> None:
    heard: list[str] = []
    source = ScriptedFetch()
    w = make(path, source, clock, on_update=heard.append,
             changed=lambda old, new: old[:1] != new[:1])
    w.poll_once()
    source.answer = "a2"  # same by the source's measure
    w.poll_once()
    source.answer = "b"
    w.poll_once()
    assert heard == ["a", "b"]


# --------------------------------------------------------------------------- the thread


def test_a_bug_in_the_fetch_is_one_error_line_and_a_failed_poll(path, clock, caplog) -> None:
    source = ScriptedFetch()
    source.failures = [RuntimeError("bug"), RuntimeError("bug")]
    w = make(path, source, clock, backoff_base=0.01, backoff_cap=0.02, interval=3600)
    with pytest.raises(RuntimeError):  # asked directly, a bug is the caller's to see
        w.poll_once()
    source.failures = [RuntimeError("bug"), RuntimeError("bug")]
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        w.start()
        try:
            assert wait_until(lambda: w.state == "a", 10, "the answer after two bugs")
        finally:
            w.stop()
    errors = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert errors[0].getMessage() == "fake source poller error"


def test_stop_is_prompt_while_waiting(path, clock) -> None:
    source = ScriptedFetch()
    w = make(path, source, clock, interval=3600)
    w.start()
    assert wait_until(lambda: w.last_success is not None, 10, "the first poll")
    thread = w.thread
    started = time.monotonic()
    w.stop()
    assert time.monotonic() - started < 1.0
    assert thread is not None and not thread.is_alive() and thread.daemon
    assert w.thread is None


def test_stop_cancels_a_call_in_flight_and_says_nothing_of_it(path, clock, caplog) -> None:
    entered = threading.Event()
    cancelled = threading.Event()

    def hanging() -> str:
        entered.set()
        cancelled.wait(30)
        raise Unanswered("cancelled")

    w = SocketWatch(path, hanging, lines=LINES, log=logging.getLogger(LOGGER),
                    name="otel-gpu-test-watch", initial=None, empty=EMPTY,
                    close=cancelled.set, clock=clock)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        w.start()
        assert wait_until(entered.is_set, 10, "the call")
        thread = w.thread
        started = time.monotonic()
        w.stop()
        assert time.monotonic() - started < 1.0
    assert thread is not None and not thread.is_alive()
    assert w.failures == 0 and said(caplog, logging.WARNING) == []


def test_stop_is_bounded_when_a_call_ignores_the_cancel(path, clock) -> None:
    entered = threading.Event()
    release = threading.Event()

    def stuck() -> str:
        entered.set()
        release.wait(30)
        return "late"

    w = SocketWatch(path, stuck, lines=LINES, log=logging.getLogger(LOGGER),
                    name="otel-gpu-test-watch", initial=None, empty=EMPTY, clock=clock)
    w.start()
    try:
        assert wait_until(entered.is_set, 10, "the call")
        thread = w.thread
        started = time.monotonic()
        w.stop(timeout=0.2)
        assert time.monotonic() - started < 1.0  # the join is bounded; the thread is a daemon
        assert thread is not None and thread.daemon
    finally:
        release.set()


def test_the_loop_outlives_a_failing_step_waits_as_asked_and_stops_at_once() -> None:
    calls: list[int] = []

    def step() -> float:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("a bug")
        return 3600.0  # then an hour's wait

    errors: list[int] = []
    loop = Loop("otel-gpu-test-loop", step, lambda: float(errors.append(1) or 0))
    assert loop.start() and not loop.start()  # idempotent
    assert wait_until(lambda: len(calls) == 3, 10, "three steps")
    thread = loop.thread
    assert thread is not None and thread.is_alive() and errors == [1, 1]
    started = time.monotonic()
    loop.stop()
    assert time.monotonic() - started < 1.0 and not thread.is_alive()
    assert calls == [1, 1, 1]  # the wait was woken, not run out
