"""Shared test doubles and helpers, imported as ``tests.support.<module>``.

- ``clock``: a hand-moved monotonic clock.
- ``exposition``: reading Prometheus text exposition as written.
- ``process``: the real ``otel-gpu`` process, HTTP reads, polling with a deadline.
- ``snapshots``: devices, device samples and snapshots built by hand.
- ``nvml``: the NVML simulator under pynvml, and what its profiles read.
- ``kubelet``: a fake kubelet Pod Resources server on a unix socket.
- ``otlp_receiver`` and ``certs``: an OTLP receiver (gRPC and HTTP) and test PKI.
- ``prometheus_server``: a real Prometheus server for dashboard queries.

Fixtures built on these live in ``tests/conftest.py``.
"""
