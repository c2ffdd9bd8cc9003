"""otel-gpu: an OpenTelemetry-native NVIDIA GPU metrics collector."""

__version__ = "0.1.0"
