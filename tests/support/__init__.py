"""Shared test doubles and helpers, imported as ``tests.support.<module>``.

- ``clock``: a hand-moved monotonic clock.
- ``exposition``: reading Prometheus text exposition as written; a fixed exposition served;
  the naming profiles' series written alone.
- ``process``: the real ``otel-gpu`` process, HTTP reads, polling with a deadline.
- ``snapshots``: devices, device samples and snapshots built by hand.
- ``nvml``: the NVML simulator under pynvml, and what its profiles read.
- ``drivers``: simulated drivers differing in one way each (older, refusing, recording).
- ``exporters``: recording metric and log exporters; SDK exporters aimed at a receiver.
- ``metrics_data``: SDK metrics data built by hand.
- ``mappers``, ``sources``, ``providers``, ``subscribers``, ``configs``: counting process
  mapper, fixed runtime source, meter doubles, recording subscriber, a toy settings class.
- ``kubelet``: a fake kubelet Pod Resources server on a unix socket.
- ``otlp_receiver`` and ``certs``: an OTLP receiver (gRPC and HTTP) and test PKI.
- ``prometheus_server``: a real Prometheus server for dashboard queries.

Fixtures built on these live in ``tests/conftest.py``. A test module defines no double
and imports no other test module or conftest (``tests/test_hygiene.py`` checks).
"""
