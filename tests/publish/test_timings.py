"""The timings the sampling interval implies, all in one place."""

from __future__ import annotations

import dataclasses

import pytest

from otel_gpu.publish.timings import Timings


@pytest.mark.parametrize(("interval", "read", "stale"), [
    (0.5, 1.0, 30.0),    # the read deadline never under 1 s, staleness never under 30 s
    (10.0, 5.0, 30.0),   # half the interval
    (60.0, 10.0, 180.0),  # never over 10 s; three missed samples
])
def test_timings_follow_the_interval(interval, read, stale):
    t = Timings.from_interval(interval)
    assert (t.interval, t.read_timeout, t.stale_after) == (interval, read, stale)
    assert t.render_max_age == interval + read  # an on-time sample always renders first
    assert t.max_backoff == max(300.0, interval)
    assert t.render_idle_after == max(3 * interval, 150.0)  # a 1-min scraper, one missed


def test_timings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Timings.from_interval(10.0).read_timeout = 1.0  # type: ignore[misc]
