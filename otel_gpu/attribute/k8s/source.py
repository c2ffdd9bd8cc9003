"""What the pod stage reads from the kubelet: the :class:`PodSource` Protocol, and what
its watcher says (:data:`LINES`).

The real source is :class:`~otel_gpu.attribute.k8s.podresources.PodResourcesWatcher`
(which imports gRPC only once a socket exists); tests hand the stage a double with the
same shape.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from otel_gpu.attribute.k8s.kubelet_answer import PodResourcesState
from otel_gpu.attribute.watch import Lines
from otel_gpu.snapshot import KubeletStats

LINES = Lines(
    what="pod-resources",
    started="polling the kubelet pod-resources API at %(path)s every %(interval)g s for pod "
            "attribution",
    absent="pod attribution off: no kubelet socket at %(path)s (picked up if it appears; in a "
           "container, mount its directory, not the socket file)",
    not_socket="kubelet pod-resources socket %(path)s is not a socket: pod attribution is off "
               "until it is (mount its directory into the container, not the socket file)",
    back="kubelet pod-resources socket %(path)s is available: pod attribution on",
    gone="kubelet pod-resources socket %(path)s disappeared (kubelet restart?); keeping the "
         "last pod attribution for %(grace).0fs",
    failed="pod-resources on %(path)s: %(reason)s; keeping the last pod attribution for the "
           "grace period (%(grace).0fs); retrying in %(delay).1fs",
    dropped="pod-resources unavailable for %(elapsed).0fs (grace period): dropping pod "
            "attribution until the kubelet answers again",
    directory="kubelet_socket %(path)s is a directory, not the kubelet's pod-resources "
              "socket: pod attribution is off; set kubelet_socket to the socket's own "
              "path%(hint)s",
    still_absent="pod attribution off: still no kubelet socket at %(path)s after "
                 "%(elapsed)s (kubelet_socket mistyped, or its directory not mounted?); pods "
                 "are not attributed until it appears, looked for every %(interval)g s",
    socket="kubelet socket",
)
"""What the kubelet's watcher says, in the words an operator of a Kubernetes node knows."""


@runtime_checkable
class PodSource(Protocol):
    """The kubelet's latest answer, polled in the background; reads are cheap and never
    call the kubelet."""

    @property
    def state(self) -> PodResourcesState | None:
        """The latest answer; None while there is no kubelet to ask."""
        ...

    @property
    def stats(self) -> KubeletStats: ...

    def poll_once(self) -> bool:
        """Ask once, now (``check``); whether the kubelet answered."""
        ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 2.0) -> None: ...

    def problem(self) -> str | None:
        """Why pods are not attributed, once it is more than a kubelet (re)starting: what
        ``/readyz`` adds to its reason (None: nothing to say)."""
        ...
