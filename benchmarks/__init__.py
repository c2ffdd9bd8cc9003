"""The performance benchmark: otel-gpu beside two baselines (see docs/performance.md)."""
