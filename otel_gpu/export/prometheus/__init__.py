"""The Prometheus exporter: the HTTP endpoint (TLS, basic auth, bounds), the text writer
and the render cache."""
