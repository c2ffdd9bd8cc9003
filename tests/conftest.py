"""Fixtures shared by every test folder; the helpers they use live in ``tests.support``."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator

import pytest

from otel_gpu.sample import containment
from otel_gpu.snapshot import Device
from testkit.kubelet import FakeKubelet
from testkit.otlp_receiver import OtlpReceiver
from testkit.process import CollectorProcess, serve_args
from tests.support.clock import FakeClock
from tests.support.nvml import FakeNvmlInstaller
from tests.support.snapshots import sample_node

SLOW = (
    "tests/test_soak.py", "tests/test_scale.py", "tests/deploy/",
    "tests/image/", "tests/e2e/test_dashboards.py",
)
"""Where the ``slow`` marker goes: what the quick loop (``-m "not slow and not support"``) skips.
Besides these places (the soak and scale runs, the deploy and image recipes, a
real Prometheus), a test that waits out real timeouts or works at scale (thousands of pods,
hundreds of GPUs, bursts of clients) carries the marker itself, with its reason beside it."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark by place, so a new test in a slow file is slow without anyone remembering to."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if path.startswith("tests/support/"):
            item.add_marker(pytest.mark.support)


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """A test that runs the CLI points the root handler at its own captured stderr, which
    pytest closes when the test ends: put the handlers back, or a thread's later line lands
    on a closed stream and prints "Logging error" into some other test's output."""
    root, ours = logging.getLogger(), logging.getLogger("otel_gpu")
    handlers, level, our_level = list(root.handlers), root.level, ours.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
        ours.setLevel(our_level)


def _expects_reader_failures(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("reader_failures") is not None


class _ReaderFailureLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, containment.MARK):
            self.lines.append(record.getMessage())


@pytest.fixture(autouse=True)
def _no_unexpected_reader_failures(request: pytest.FixtureRequest) -> Iterator[None]:
    """A reader failure is contained in production (one line, one count) and so easy to
    miss: here it fails the test, unless the test is marked ``reader_failures``."""
    caught = _ReaderFailureLines()
    logger = logging.getLogger(containment.__name__)
    logger.addHandler(caught)
    try:
        yield
    finally:
        logger.removeHandler(caught)
    if caught.lines and not _expects_reader_failures(request):
        pytest.fail("a reader failed unexpectedly: " + "; ".join(caught.lines[:3]))


@pytest.fixture
def collector(request: pytest.FixtureRequest) -> Iterator[Callable[..., CollectorProcess]]:
    """Start ``otel-gpu serve`` on a free port; always stopped afterwards. A reader failure
    in its output fails the test unless the test is marked ``reader_failures``."""
    started: list[CollectorProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, interval: str = "0.2",
              wait: bool = True) -> CollectorProcess:
        proc = CollectorProcess(serve_args(*args, interval=interval), env=env)
        started.append(proc)
        if wait:
            proc.wait_serving()
        return proc

    yield start
    for proc in started:
        proc.stop(signal.SIGKILL)
    failures = [line for proc in started for line in proc.lines
                if containment.WHAT_HAPPENED in line]
    if failures and not _expects_reader_failures(request):
        pytest.fail("a reader failed unexpectedly in the collector: " + "; ".join(failures[:3]))


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    """A fake kubelet serving nothing yet, on its own short socket path."""
    fake = FakeKubelet()
    fake.start()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """An OTLP receiver on free gRPC and HTTP ports, without TLS."""
    rx = OtlpReceiver().start()
    try:
        yield rx
    finally:
        rx.stop()


@pytest.fixture
def fake_nvml(tmp_path) -> Iterator[FakeNvmlInstaller]:
    """``fake_nvml(spec, sleep=..., init=...)`` puts a simulated driver under pynvml
    (see ``tests.support.nvml``); it is taken away when the test ends.
    """
    installer = FakeNvmlInstaller(tmp_path)
    try:
        yield installer
    finally:
        installer.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def node_devices() -> tuple[Device, ...]:
    """Three GPUs whose minor numbers differ from their NVML indexes; GPU1 in MIG mode."""
    return sample_node()
