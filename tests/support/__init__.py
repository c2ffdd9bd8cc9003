"""Shared test doubles and helpers, imported as ``tests.support.<module>``.

- ``clock``: a hand-moved monotonic clock.
- ``snapshots``: devices, device samples and snapshots built by hand.
- ``nvml``: the NVML simulator under pynvml, and what its profiles read.
- ``drivers``: simulated drivers differing in one way each (older, refusing, recording).
- ``exporters``: recording metric and log exporters; SDK exporters aimed at a receiver.
- ``metrics_data``: SDK metrics data built by hand.
- ``mappers``, ``sources``, ``providers``, ``subscribers``, ``configs``: counting process
  mapper, fixed runtime source, meter doubles, recording subscriber, a toy settings class.
- ``certs``: test PKI.
- ``prometheus_server``: a real Prometheus server for dashboard queries.

The doubles the benchmarks use too (the fake kubelet, the OTLP receiver, the exposition
reader, the collector process, the benchmark's scenarios) are in the top-level ``testkit``
package, which ``benchmarks/`` imports instead of this.

Fixtures built on these live in ``tests/conftest.py``. A test module defines no double
and imports no other test module or conftest (``tests/test_hygiene.py`` checks).
"""
