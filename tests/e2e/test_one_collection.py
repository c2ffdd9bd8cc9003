"""The real process: /metrics and OTLP written from one SDK collection per sample."""

from __future__ import annotations

from testkit.exposition import series
from testkit.process import wait_until


def _sample_and_age(req) -> tuple[float, float] | None:
    rows = {r.metric: r.value for r in req.rows()
            if r.metric in ("otel_gpu.samples", "otel_gpu.sample.age")}
    if len(rows) != 2:
        return None
    return rows["otel_gpu.samples"], rows["otel_gpu.sample.age"]


def test_otlp_pushes_the_collection_the_body_was_written_from(collector, receiver):
    """Each push carries exactly the values of the /metrics body of the same sample, down to
    the sample's age at the moment it was collected: no second collection of its own."""
    env = {**receiver.env("http/protobuf"), "OTEL_METRIC_EXPORT_INTERVAL": "600"}
    proc = collector("--simulate", "h100x8", env=env, interval="0.25")
    bodies: dict[float, float] = {}  # otel_gpu_samples_total -> otel_gpu_sample_age_seconds

    def matched() -> list[tuple[float, float]] | None:
        text = proc.metrics()
        samples, ages = (series(text, name) for name in ("otel_gpu_samples_total",
                                                         "otel_gpu_sample_age_seconds"))
        if samples and ages:  # none before the first sample
            (_, seq), (_, age) = samples[0], ages[0]
            assert bodies.setdefault(seq, age) == age, "one body per sample"
        pushed = [p for p in map(_sample_and_age, receiver.requests) if p is not None]
        seen = [p for p in pushed if p[0] in bodies]
        return seen if len(seen) >= 3 else None

    seen = wait_until(matched, timeout=30, what="three pushes of samples /metrics also showed")
    for seq, age in seen:
        assert age == bodies[seq], (seq, age, bodies[seq])
