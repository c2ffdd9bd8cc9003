"""The Prometheus exporter: the ``/metrics`` body, its exposition formats, the text writer
and the body cache; the service's endpoint serves it."""
