"""Kubelet Pod Resources watcher: the collector's one watcher of the kubelet's socket.

The kubelet rate-limits its pod-resources socket with one token bucket shared
by every agent on the node, and a List reply can be megabytes on a busy node.
So the collector never asks on a scrape: :class:`PodResourcesWatcher` is a
:class:`~otel_gpu.attribute.watch.SocketWatch` (its thread, grace period,
jittered backoff, socket lines and counters) whose fetch asks the kubelet
through :class:`~otel_gpu.attribute.k8s.kubelet_rpc.PodResourcesClient` and
publishes an immutable :class:`PodResourcesState`. Readers (scrapes,
instrument callbacks) only read :attr:`PodResourcesWatcher.state`.

gRPC and the kubelet's API stubs cost memory and start-up time (about 12 MiB
and 90 ms), and a node that is not a Kubernetes node never needs them: this
module imports neither, and the client (with gRPC) is built by the first
fetch, once a socket is there. A missing socket is a failed poll, neither
counted nor backed off: a kubelet restart removes its socket, and the last
state is kept for the grace period; one absent since the start is warned of
past the grace period, and a directory at the path is said to be one.

The answer's types and their conversion are in
:mod:`otel_gpu.attribute.k8s.kubelet_answer`, the channel, its calls and the
protocol's failure handling in :mod:`otel_gpu.attribute.k8s.kubelet_rpc`.
"""

from __future__ import annotations

import logging
import os
import random as _random
import stat
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from otel_gpu.attribute.k8s.device_ids import ResourceFilter
from otel_gpu.attribute.k8s.kubelet_answer import EMPTY_STATE, PodResourcesState
from otel_gpu.attribute.k8s.source import LINES
from otel_gpu.attribute.watch import Presence, SocketWatch
from otel_gpu.snapshot import KubeletStats

if TYPE_CHECKING:  # imports gRPC
    from otel_gpu.attribute.k8s.kubelet_rpc import PodResourcesClient

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""Receive limit; gRPC's own 4 MiB default is too small for busy nodes."""
SOCKET_NAME = "kubelet.sock"
"""The socket's name in the kubelet's pod-resources directory."""


def _new_answer(old: PodResourcesState | None, new: PodResourcesState | None) -> bool:
    """Whether the pipeline should hear of ``new``: its pods or devices differ."""
    if old is None or new is None:
        return old is not new
    return (old.allocations, old.allocatable) != (new.allocations, new.allocatable)


class PodResourcesWatcher(SocketWatch[PodResourcesState | None, tuple[str, str]]):
    """Polls the kubelet's Pod Resources API and publishes the result.

    The watcher (:class:`~otel_gpu.attribute.watch.SocketWatch`) asks every
    ``interval`` seconds after a success, after an exponential backoff with full
    jitter (``backoff_base`` doubling up to ``backoff_cap``) after a failure.
    ``GetAllocatableResources`` is asked every ``allocatable_every`` polls.
    Requests are counted by (rpc short name, gRPC status code name).
    ``on_update`` hears of each answer whose pods or devices changed. ``initial`` is
    the state until a look finds the socket (the empty answer from then until the
    kubelet's first): None (the collector's) tells the pod stage there is nothing to
    join while no socket has been there.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        interval: float = 10.0,
        grace_period: float = 60.0,
        timeout: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        allocatable_every: int = 6,
        backoff_base: float = 1.0,
        backoff_cap: float = 60.0,
        resource_names: Iterable[str] = (),
        dra_drivers: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
        random: Callable[[], float] = _random.random,
        log_interval: float = 60.0,
        absent_every: float = 600.0,
        initial: PodResourcesState | None = EMPTY_STATE,
        on_update: Callable[[PodResourcesState | None], None] | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if max_message_bytes < 4 * 1024 * 1024:
            raise ValueError("max_message_bytes below gRPC's 4 MiB default makes no sense")
        self.timeout = float(timeout)
        self.max_message_bytes = int(max_message_bytes)
        self.allocatable_every = max(1, int(allocatable_every))
        self.accept = ResourceFilter(resource_names, dra_drivers)
        self._client: PodResourcesClient | None = None
        """Built by the first fetch (the poll's own: one poll at a time)."""
        super().__init__(socket_path, self._ask, lines=LINES, log=log,
                         name="otel-gpu-podresources", initial=initial, empty=EMPTY_STATE,
                         close=self._close, interval=interval,
                         grace_period=grace_period, backoff_base=backoff_base,
                         backoff_cap=backoff_cap, clock=clock, random=random,
                         log_interval=log_interval, absent_every=absent_every,
                         on_update=on_update, changed=_new_answer)

    @property
    def client(self) -> PodResourcesClient | None:
        """The protocol, once a fetch built it (a socket was there): gRPC is imported then."""
        return self._client

    @property
    def stats(self) -> KubeletStats:
        state = self.state or EMPTY_STATE
        return KubeletStats(
            requests=self.requests,
            last_success_monotonic=self.last_success,
            pods=state.pod_count,
            devices=state.device_count,
            source=state.source,
            consecutive_failures=self.failures,
            socket_present=self.socket_present,
        )

    def problem(self) -> str | None:
        """Why pods are not attributed, past a kubelet restart (the watcher's outage), in
        the setting's words for a directory."""
        if self.presence is Presence.NOT_SOCKET and os.path.isdir(self.socket_path):
            return f"kubelet_socket {self.socket_path} is a directory, not the socket"
        return self.outage()

    def directory_hint(self) -> str:
        """Where the socket is when the directory holds one by its usual name."""
        inside = os.path.join(self.socket_path, SOCKET_NAME)
        try:
            if stat.S_ISSOCK(os.stat(inside).st_mode):
                return f" ({inside} is there)"
        except OSError:
            pass
        return f" (the kubelet's is {SOCKET_NAME} in it; none there now)"

    def _ask(self) -> PodResourcesState:
        client = self._client
        if client is None:  # the first fetch: a socket is there
            from otel_gpu.attribute.k8s.kubelet_rpc import PodResourcesClient

            client = self._client = PodResourcesClient(self, self._limiter, log)
        return client.ask()

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
