"""Every timing derived from the sampling interval, in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timings:
    """What the sampling interval implies for the other stages (seconds).

    Built once from the interval (:meth:`from_interval`); tests replace single
    fields with :func:`dataclasses.replace`.
    """

    interval: float
    read_timeout: float
    """How long a sample waits for each GPU before calling it hung."""
    render_max_age: float
    """How old a rendered body may get before a scrape renders again."""
    render_idle_after: float
    """How long after the last scrape a publication still renders /metrics at once; past
    it, nobody is scraping and the next scrape renders (see export.prometheus)."""
    stale_after: float
    """How old the latest sample may be before the collector stops being ready."""
    max_backoff: float
    """The longest wait between two tries after a sample raised (a bug)."""

    @classmethod
    def from_interval(cls, interval: float) -> Timings:
        # Half the interval, 1-10 s: a hung GPU costs a sample at most that much.
        read_timeout = min(max(interval / 2, 1.0), 10.0)
        return cls(
            interval=interval,
            read_timeout=read_timeout,
            # A sample's interval and its read deadline: a sampler on time always
            # publishes (and so renders) before a scrape would render on its own.
            render_max_age=interval + read_timeout,
            # Longer than any usual scrape interval (Prometheus' default is 1 min), so that a
            # scraper, missing one scrape, still finds every body rendered before it asks.
            render_idle_after=max(3 * interval, 150.0),
            # Three missed samples, and never under 30 s, so one slow sample is not an outage.
            stale_after=max(3 * interval, 30.0),
            max_backoff=max(300.0, interval),
        )
