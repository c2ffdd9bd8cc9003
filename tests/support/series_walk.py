"""A direct collection's collections while its series change at random (the writers' walk)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import SimpleNamespace

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_gpu.instrument.direct import DirectCollection
from otel_gpu.instrument.schema import Kind
from otel_gpu.instrument.series import SeriesData


def series_walk(seed: int, steps: int) -> Iterator[SeriesData | None]:
    """A direct collection's collections while its instruments' series change at random:
    attribute objects copied (the same series), pods set (new series), series dropped and
    back, metrics silent, a gauge of the same family under another scope."""
    rng = random.Random(seed)
    sets = [{"hw.id": f"GPU-{i}", "odd": 'q"\\' if i == 2 else "", "n": i % 2 == 0}
            for i in range(4)]
    rows = {("hw.power", "otel_gpu"): (Kind.GAUGE, "W"), ("hw.energy", "otel_gpu"):
            (Kind.COUNTER, "J"), ("extra", "otel_gpu"): (Kind.UPDOWNCOUNTER, "1"),
            ("hw.power", "other"): (Kind.GAUGE, "W")}
    live = {key: list(sets[:3]) for key in rows}
    instruments = []
    for key, (kind, unit) in rows.items():
        scope = InstrumentationScope(key[1], "1")
        instrument = SimpleNamespace(name=key[0], description="d", unit=unit,
                                     instrumentation_scope=scope)
        instruments.append((instrument, kind, lambda key=key: [
            (float(rng.choice([0, 1, 2.5, 1e6])), attrs) for attrs in live[key]]))
    collection = DirectCollection(Resource({"service.name": "s"}), instruments)
    for _ in range(steps):
        key = rng.choice(sorted(live))
        series = live[key]
        move = rng.randrange(7)
        if move == 1 and series:
            i = rng.randrange(len(series))
            series[i] = dict(series[i])
        elif move == 2 and series:
            i = rng.randrange(len(series))
            series[i] = {**series[i], "k8s.pod.name": f"pod-{rng.randrange(3)}"}
        elif move == 3:
            series.append(rng.choice(sets))
        elif move == 4 and series:
            series.pop(rng.randrange(len(series)))
        elif move == 5:
            live[key] = [] if series else list(sets)
        yield collection.collect()
