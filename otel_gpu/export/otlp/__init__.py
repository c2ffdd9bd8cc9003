"""The OTLP exporter: one transport for metrics and logs, their encoding, the push, and one
Resource per workload."""
