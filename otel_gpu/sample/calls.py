"""One device's plain NVML calls: one per :class:`~otel_gpu.sample.readers.Reader`.

A static reader is read once per device; a reader with ``changes_with`` only
when what it depends on moved (and at least once per rediscovery period); a
field's fallback only where the batched field is not answered. Run on the
device's worker thread. A reader that raises costs its own values this sample,
not the others' (:mod:`~otel_gpu.sample.containment`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from otel_gpu.sample.containment import describe
from otel_gpu.sample.device import Tracked
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.outcomes import Outcomes
from otel_gpu.sample.readers import COMPUTE_PROCESSES, NVLINK_STATES, Reader
from otel_gpu.sample.sources import Source
from otel_gpu.sample.workers import DeviceWorker


class CallReads:
    """The catalog's plain-call readers, for one device at a time."""

    def __init__(self, nvml: Nvml, sources: Iterable[Source], outcomes: Outcomes, *,
                 process_usage: bool, refresh_every: int) -> None:
        self._nvml = nvml
        self._m = nvml.module
        # A field's fallback call is a reader too, read only where the field is not answered.
        self._readers: tuple[Reader, ...] = tuple(
            dict.fromkeys(r for s in sources for r in (s.reader, s.fallback)
                          if r is not None and r is not NVLINK_STATES)
        )
        self._outcomes = outcomes
        self._process_usage = process_usage
        self._refresh_every = refresh_every

    @property
    def names(self) -> tuple[str, ...]:
        """The readers' names: what their failures are counted by."""
        return tuple(r.name for r in self._readers)

    def read(
        self, t: Tracked, values: dict[str, float], unsupported: list[str],
        worker: DeviceWorker, retry: set[str], seq: int,
    ) -> str | None:
        """The readers' answers into ``values``; the failure text when the device failed.

        ``retry``: the fields the batch failed this time, whose call stands in.
        """
        reads = t.reads
        for reader in self._readers:
            if reader.name in reads.unsupported:
                continue
            if reader is COMPUTE_PROCESSES and self._process_usage:
                continue  # the process reads make the same call and count them too
            if reader.fallback_for and not (
                    "fields" in reads.unsupported
                    or any(key in reads.unsupported or key in t.links.unbatched or key in retry
                           for key in reader.fallback_for)):
                continue  # what it stands in for is there
            if reader.name in reads.static:
                values.update(reads.static[reader.name])
                continue
            basis = tuple(values.get(key) for key in reader.changes_with)
            kept = reads.kept.get(reader.name)
            if (kept is not None and None not in basis and kept[0] == basis
                    and seq - kept[1] < self._refresh_every):
                values.update(kept[2])  # what it depends on has not moved: nor has it
                continue
            with worker.doing(reader.name):
                res = self._nvml.call(reader.read, self._m, t.handle)
            if res.ok:
                try:
                    answer = _answer(res.value)
                except (TypeError, ValueError) as exc:
                    self._outcomes.failures.record(t.label(), reader.name, describe(exc), exc)
                    continue
                values.update(answer)
                if reader.static:
                    reads.static[reader.name] = answer
                elif reader.changes_with:
                    reads.kept[reader.name] = (basis, seq, answer)
                continue
            failure = self._outcomes.act(t, reader.name, res, unsupported)
            if failure is not None:
                return failure
        return None


def _answer(value: Any) -> dict[str, float]:
    """A reader's answer as ``{key: value}``; raises TypeError for anything else."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise TypeError(f"a reader answered {type(value).__name__}, not a mapping of values")
    return dict(value)
