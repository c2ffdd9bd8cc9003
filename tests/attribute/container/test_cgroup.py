"""Container ids from cgroup paths: each runtime's formats, cgroup v1 and v2."""

from __future__ import annotations

import pytest

from otel_gpu.attribute.container.cgroup import container_id

CID = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
OUTER = "a" * 64
UID_ = "6b1e1f0e_4d1c_4b7e_9d9a_2f8f1d2c3b4a"


@pytest.mark.parametrize("text", [
    # Docker, systemd driver, cgroup v2 (the default on current distributions)
    f"0::/system.slice/docker-{CID}.scope\n",
    # Docker, cgroupfs driver, cgroup v2
    f"0::/docker/{CID}\n",
    # Docker rootless
    f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{CID}.scope\n",
    # Podman rootful, rootless, and a container running systemd (a directory below)
    f"0::/machine.slice/libpod-{CID}.scope\n",
    f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope\n",
    f"0::/machine.slice/libpod-{CID}.scope/container\n",
    # Podman, cgroupfs
    f"0::/libpod_parent/libpod-{CID}\n",
    # containerd: nerdctl with systemd, ctr/nerdctl with cgroupfs (namespace/id)
    f"0::/system.slice/nerdctl-{CID}.scope\n",
    f"0::/default/{CID}\n",
    # CRI-O outside Kubernetes
    f"0::/machine.slice/crio-{CID}.scope\n",
])
def test_cgroup_v2_paths(text):
    assert container_id(text) == CID


def test_cgroup_v1_docker_file():
    path = f"/docker/{CID}"
    text = "\n".join([f"12:hugetlb:{path}", f"11:memory:{path}", f"10:cpu,cpuacct:{path}",
                      f"1:name=systemd:/system.slice/docker-{CID}.scope", "0::/"])
    assert container_id(text) == CID


def test_cgroup_v1_podman_systemd_file():
    path = f"/machine.slice/libpod-{CID}.scope"
    assert container_id(f"7:devices:{path}\n4:memory:{path}\n1:name=systemd:{path}\n") == CID


def test_nested_runtimes_give_the_outer_container():
    assert container_id(f"0::/docker/{OUTER}/docker/{CID}\n") == OUTER


@pytest.mark.parametrize("text", [
    "0::/user.slice/user-1000.slice/session-3.scope\n",  # a login session
    "0::/system.slice/ollama.service\n",  # a host service
    f"0::/machine.slice/libpod-conmon-{CID}.scope\n",  # Podman's monitor, not the container
    f"0::/system.slice/crio-conmon-{CID}.scope\n",
    "0::/\n",
    "",
    "garbage without colons",
    f"0::/docker/{CID[:-1]}\n",  # 63 digits
    f"0::/docker/{CID.upper()}\n",
    # a pod's container: Kubernetes attribution names it, not this
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
    f"cri-containerd-{CID}.scope\n",
    f"0::/kubepods/besteffort/pod6b1e1f0e-4d1c-4b7e-9d9a-2f8f1d2c3b4a/{CID}\n",
])
def test_no_container(text):
    assert container_id(text) is None
