"""Stage 4, instrument: the metric catalog as OpenTelemetry instruments."""
