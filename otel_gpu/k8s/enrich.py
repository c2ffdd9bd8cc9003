"""The attribution stage: joins each new snapshot with the kubelet's latest answer.

It runs when a sample is taken and when the kubelet's answer changes (on
those threads, never on a scrape), so instrument callbacks find the pods
already attached to the snapshot they read and never touch the kubelet,
sysfs, or the join itself.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from otel_gpu._log import LogLimiter
from otel_gpu.k8s.attribution import Attributor
from otel_gpu.k8s.podresources import PodResourcesWatcher
from otel_gpu.snapshot import Pods, Snapshot

log = logging.getLogger(__name__)


class PodEnricher:
    """Attaches :class:`~otel_gpu.snapshot.Pods` to snapshots; cheap when nothing changed."""

    def __init__(self, watcher: PodResourcesWatcher, sysfs_root: Path = Path("/")) -> None:
        self.watcher = watcher
        self.sysfs_root = Path(sysfs_root)
        self._attributor: Attributor | None = None
        self._limiter = LogLimiter(log, 3600.0)

    def __call__(self, snapshot: Snapshot) -> Snapshot:
        devices = tuple(s.device for s in snapshot.devices)
        if self._attributor is None or self._attributor.devices != devices:
            self._attributor = Attributor(devices, self.sysfs_root)
        state = self.watcher.state
        attribution = self._attributor(state)
        for skipped in attribution.unresolved:
            self._limiter.once(
                ("unresolved", skipped.resource_name, skipped.device_id), logging.WARNING,
                "kubelet lists %s %r, which was skipped: %s",
                skipped.resource_name, skipped.device_id, skipped.reason,
            )
        pods = Pods(attribution, self.watcher.stats, state.taken_monotonic)
        return replace(snapshot, pods=pods)
