"""A stop that always ends: SIGTERM stops the real process within the documented 5 s while
everything it waits on hangs (a GPU's read, the XID event wait, the kubelet, the OTLP
backend). A DaemonSet pod that does not stop holds its node's rollout."""

from __future__ import annotations

import socket
import textwrap
from collections.abc import Iterator

import pytest

from testkit.process import wait_until

BOUND_S = 5.0
"""README: SIGTERM, SIGINT and SIGHUP stop it within 5 seconds."""
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def never_answers(tmp_path) -> Iterator[tuple[str, str]]:
    """(a unix socket path, a TCP address): both listen and never accept a connection."""
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tcp = socket.socket()
    try:
        path = str(tmp_path / "kubelet.sock")
        unix.bind(path)
        unix.listen(1)
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(1)
        yield path, f"127.0.0.1:{tcp.getsockname()[1]}"
    finally:
        unix.close()
        tcp.close()


@pytest.mark.slow  # seconds of real time (a hung export, many samples): not in the quick loop
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_sigterm_with_everything_hung_ends_within_the_bound(collector, tmp_path,
                                                            never_answers, protocol):
    kubelet, otlp = never_answers
    scenario = tmp_path / "hung.yaml"
    scenario.write_text(textwrap.dedent(f"""
        driver_version: "550.90.07"
        shapes: [{{function: nvmlEventSetWait_v2, shape: hang, after: 2}}]
        devices:
          - name: {H100}
            memory: {{total: 85520809984, used: 1}}
          - name: {H100}
            memory: {{total: 85520809984, used: 1}}
            slow: [{{function: nvmlDeviceGetMemoryInfo, seconds: 3600, after: 2}}]
    """))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{otlp}", "OTEL_EXPORTER_OTLP_PROTOCOL":
           protocol, "OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "10"}
    proc = collector("--simulate", str(scenario), "--kubelet-socket", kubelet,
                     "--kubelet-interval", "0.1", env=env)
    proc.wait_sample(4)
    wait_until(lambda: any("has not returned" in ln for ln in proc.lines), 15,
               "the hung read to be reported")
    code, took = proc.stop(timeout=3 * BOUND_S)
    assert code == 0 and took < BOUND_S, (code, took, proc.log[-3000:])


HOLDS = {
    "exit handler": "atexit.register(hold_the_exit)",
    "thread that is not a daemon": "threading.Thread(target=hold_the_exit, daemon=False).start()",
}


@pytest.mark.slow  # waits out the bound
@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_what_holds_the_interpreter_after_the_stop_cannot_hold_the_pod(collector, tmp_path,
                                                                       hold):
    """The service's stop is bounded, but what runs after it (a library's exit handler, a
    thread that is not a daemon) is not ours: the process still ends within the bound, and
    its stacks name what held it."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import atexit, threading

        def hold_the_exit():
            threading.Event().wait()

        {HOLDS[hold]}
    """))
    proc = collector("--simulate", "h100x8", env={"PYTHONPATH": str(tmp_path)})
    proc.wait_sample(1)
    code, took = proc.stop(timeout=3 * BOUND_S)
    assert code == 0 and took < BOUND_S, (code, took, proc.log[-3000:])
    assert "did not end within 4 s of the stop signal" in proc.log
    assert "hold_the_exit" in proc.log  # the stacks name the holder


@pytest.mark.slow  # waits out the bound
def test_a_signal_while_the_service_is_still_starting_ends_it_within_the_bound(collector,
                                                                              tmp_path):
    """A main thread that never leaves start-up (Python retries a blocked call after the
    handler ran) never reaches the stop: the bound starts in the handler itself."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import threading
        import otel_gpu.wiring

        started = otel_gpu.wiring.Service.start

        def hold_the_exit(self):
            started(self)
            print("holding the start", flush=True)
            threading.Event().wait()

        otel_gpu.wiring.Service.start = hold_the_exit
    """))
    proc = collector("--simulate", "h100x8", env={"PYTHONPATH": str(tmp_path)}, wait=False)
    wait_until(lambda: "holding the start" in proc.log, 20, "the start to be held")
    code, took = proc.stop(timeout=3 * BOUND_S)
    assert code == 0 and took < BOUND_S, (code, took, proc.log[-3000:])
    assert "hold_the_exit" in proc.log
