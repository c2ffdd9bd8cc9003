"""The runtime poller against a real HTTP server on a unix socket (the Docker API's JSON)."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from otel_gpu.attribute.container import runtime as rt
from otel_gpu.attribute.container.runtime import EMPTY, RuntimeWatch, image_name
from otel_gpu.workload import ContainerRef
from tests.support.container_runtime import FakeRuntime, docker_container

A = "a" * 64
B = "b" * 64
LOGGER = "otel_gpu.attribute.container.runtime"


@pytest.fixture
def runtime():
    with FakeRuntime() as fake:
        yield fake


def watch(runtime: FakeRuntime, **kw) -> RuntimeWatch:
    kw.setdefault("timeout", 2.0)
    return RuntimeWatch(runtime.socket_path, **kw)


@pytest.mark.parametrize(("reference", "name"), [
    ("pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime", "pytorch/pytorch"),
    ("nvcr.io/nvidia/tritonserver:24.05-py3", "nvcr.io/nvidia/tritonserver"),
    ("registry.local:5000/team/app", "registry.local:5000/team/app"),
    ("registry.local:5000/team/app:v1", "registry.local:5000/team/app"),
    ("ollama/ollama@sha256:" + "1" * 64, "ollama/ollama"),
    ("ubuntu", "ubuntu"),
    ("sha256:" + "2" * 64, None),  # what a container shows once its tag is gone
    ("2" * 64, None),
    ("", None),
])
def test_image_names_lose_their_tag_and_digest(reference, name):
    assert image_name(reference) == name


def test_names_and_images_from_the_documented_answer(runtime):
    runtime.set_containers([docker_container(A, "trainer", "pytorch/pytorch:2.3"),
                            docker_container(B, "llm", "ollama/ollama:latest")])
    w = watch(runtime)
    assert w.state is None  # not asked yet
    assert w.poll_once()
    assert dict(w.state.containers) == {A: ContainerRef(A, "trainer", "pytorch/pytorch"),
                                        B: ContainerRef(B, "llm", "ollama/ollama")}
    assert runtime.paths == ["/containers/json"]
    assert w.stats.requests == {"ok": 1} and w.stats.containers == 2
    assert w.stats.socket_present is True


def test_no_socket_is_off_said_once_and_picked_up_when_it_appears(tmp_path, caplog):
    path = f"/tmp/rt-absent-{os.getpid()}.sock"
    w = RuntimeWatch(path, timeout=2.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert not w.poll_once() and not w.poll_once()
        assert w.state is None and w.stats.socket_present is False
        with FakeRuntime(path) as runtime:
            runtime.set_containers([docker_container(A, "trainer", "app:1")])
            assert w.poll_once()
            assert w.state.containers[A].name == "trainer"
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len([m for m in said if "container attribution off" in m]) == 1
    assert len([m for m in said if "naming containers" in m]) == 1


@pytest.mark.parametrize(("body", "status", "reason"), [
    (b"\xff\xfe not utf-8", 200, "not UTF-8 JSON"),
    (b"{\"message\": \"no\"}", 200, "not a list"),
    (b"[1, 2", 200, "not UTF-8 JSON"),
    (b"{\"message\": \"server error\"}", 500, "HTTP 500"),
])
def test_a_bad_answer_is_one_line_and_keeps_the_names_for_the_grace_period(
        runtime, clock, caplog, body, status, reason):
    runtime.set_containers([docker_container(A, "trainer", "app:1")])
    w = watch(runtime, clock=clock, grace_period=60.0, random=lambda: 1.0)
    assert w.poll_once()
    good = w.state
    runtime.answer_next(3, body, status)
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            clock.advance(1)
            assert not w.poll_once()
            assert w.state.containers == good.containers
    lines = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(lines) == 1 and reason in lines[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]
    assert 0 < w.next_delay <= 60.0
    clock.advance(60)
    assert w.state is EMPTY  # then dropped: containers keep their ids only
    assert w.poll_once() and w.state.containers[A].name == "trainer"


def test_the_answer_is_bounded_in_size_count_and_time(runtime, monkeypatch):
    runtime.set_containers([docker_container(f"{i:064x}", f"c{i}", "app") for i in range(50)])
    w = watch(runtime, max_bytes=4096)
    assert not w.poll_once()  # over the size bound
    monkeypatch.setattr(rt, "MAX_CONTAINERS", 10)
    w = watch(runtime)
    assert w.poll_once() and len(w.state.containers) == 10
    runtime.set_containers([docker_container(A, "x" * 10_000, "app")])
    assert w.poll_once() and len(w.state.containers[A].name) == rt.MAX_NAME_CHARS
    runtime.set_containers([docker_container(A, "trainer", "app")])
    runtime.trickle = 0.05  # about 10 s for the answer: the deadline is for the whole of it
    w = watch(runtime, timeout=0.5)
    started = time.monotonic()
    assert not w.poll_once()
    assert time.monotonic() - started < 2.0


def test_odd_entries_are_skipped(runtime):
    entries = [docker_container(A, "good", "app:1"), {"Id": "short"}, "text", None,
               {"Id": B, "Names": "not a list", "Image": 5}]
    runtime.answer_next(1, json.dumps(entries).encode())
    w = watch(runtime)
    assert w.poll_once()
    assert dict(w.state.containers) == {A: ContainerRef(A, "good", "app"),
                                        B: ContainerRef(B, None, None)}


def test_the_thread_polls_and_stops(runtime):
    runtime.set_containers([docker_container(A, "trainer", "app")])
    w = watch(runtime, interval=0.05)
    w.start()
    try:
        from testkit.process import wait_until

        assert wait_until(lambda: runtime.calls >= 3, 10, "three polls")
    finally:
        w.stop()
    assert w.state.containers[A].name == "trainer"
