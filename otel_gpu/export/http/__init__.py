"""The service's HTTP: the bounded server, the endpoint's paths, the web config's TLS and
basic auth. It serves the health probes with or without an exporter, and an exporter's
``/metrics`` body only through the seam (:class:`~otel_gpu.export.seam.Scrape`)."""
