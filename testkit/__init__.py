"""What the tests and the benchmarks both stand on, imported as ``testkit.<module>``.

- ``kubelet``: a fake kubelet Pod Resources server on a unix socket.
- ``otlp_receiver``: an OTLP receiver (gRPC and HTTP) recording every export.
- ``exposition``: Prometheus text exposition read exactly as written; a fixed exposition
  served; the naming profiles' series written alone.
- ``process``: the real ``otel-gpu`` process, HTTP reads, polling with a deadline.
- ``scenarios``: the benchmark's simulated nodes (scenario files, time-sliced pods).

It is its own package so that ``tests/`` and ``benchmarks/`` (and ``scripts/``) never
import each other: both import this, and this imports neither (an import-linter contract
in ``pyproject.toml`` keeps it so). It is not part of the ``otel_gpu`` wheel.
"""
