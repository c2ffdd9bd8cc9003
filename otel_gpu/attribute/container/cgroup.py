"""The container id in a process's ``/proc/<pid>/cgroup``, for containers outside Kubernetes.

Each runtime names a container's cgroup after its 64-hex-digit id:

* Docker: ``/system.slice/docker-<id>.scope`` (systemd driver, cgroup v2, and
  rootless under ``user@<uid>.service``), ``/docker/<id>`` (cgroupfs driver, v1 or v2);
* Podman: ``/machine.slice/libpod-<id>.scope`` (rootful), under
  ``user@<uid>.service`` rootless, ``/libpod_parent/libpod-<id>`` (cgroupfs), with
  a ``container`` directory below it when the container runs systemd;
* containerd (nerdctl, ctr): ``/system.slice/nerdctl-<id>.scope``, or
  ``/<namespace>/<id>`` (cgroupfs);
* CRI-O: ``crio-<id>.scope``.

cgroup v1 has one line per hierarchy (which agree); v2 the one ``0::`` line.
Paths under ``kubepods`` are pods' (:mod:`otel_gpu.attribute.k8s.processes`),
and runtime helpers that are no container (``libpod-conmon-``, ``crio-conmon-``)
are skipped. In a nested runtime (Docker in Docker) the outermost id is
taken: that is the container the host's runtime lists.
"""

from __future__ import annotations

import re

_SEGMENT = re.compile(
    r"^(?:docker-|libpod-|crio-|cri-containerd-|nerdctl-|containerd-)?([0-9a-f]{64})"
    r"(?:\.scope)?$")
_KUBEPODS = re.compile(r"(?:^|-)kubepods(?:[.-]|$)")


def container_id(text: str) -> str | None:
    """The id of the container a cgroup file places the process in; None for a host
    process, a pod's (Kubernetes attribution names those), or a file naming none."""
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        segments = [s for s in path.strip().split("/") if s]
        if any(_KUBEPODS.search(s) for s in segments):
            return None
        for segment in segments:
            match = _SEGMENT.match(segment)
            if match is not None:
                return match.group(1)
    return None
