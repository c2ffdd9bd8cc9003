"""Stage 5, export: the Prometheus endpoint, OTLP metrics and logs, naming profiles, GPU events."""
