"""Exporters: the Prometheus scrape endpoint (and OTLP push)."""
