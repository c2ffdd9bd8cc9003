"""Kubernetes pod attribution: which pod holds which GPU or MIG instance.

- :mod:`otel_gpu.attribute.k8s.device_ids` parses the device ids device plugins and DRA
  drivers report, and resolves them to NVML uuids (pure functions).
- :mod:`otel_gpu.attribute.k8s.podresources` polls the kubelet's Pod Resources API on a
  background thread and publishes an immutable state (scrapes never call the
  kubelet).
- :mod:`otel_gpu.attribute.k8s.attribution` joins that state with the node's devices.
"""
