"""Slurm job ids from /proc/<pid>/cgroup: v2 and v1 layouts, and what is not Slurm."""

from __future__ import annotations

import logging

import pytest

from otel_gpu.attribute.hpc.slurm import SlurmJobs, parse_slurm_cgroup
from otel_gpu.attribute.k8s.processes import CGROUP_MAX_BYTES
from otel_gpu.sim.node import cgroup_file

V1_CONTROLLERS = """\
12:pids:/slurm/uid_1000/job_{job}/step_batch/task_0
11:memory:/slurm/uid_1000/job_{job}/step_batch/task_0
4:devices:/slurm/uid_1000/job_{job}/step_batch/task_0
3:cpuset:/slurm/uid_1000/job_{job}/step_batch
1:name=systemd:/system.slice/slurmd.service
0::/
"""


@pytest.mark.parametrize(("text", "job"), [
    # cgroup v2: slurmstepd's scope, every kind of step
    ("0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0\n", "1234"),
    ("0::/system.slice/slurmstepd.scope/job_1234/step_batch/user/task_0\n", "1234"),
    ("0::/system.slice/slurmstepd.scope/job_42/step_extern/user/task_special\n", "42"),
    ("0::/system.slice/slurmstepd.scope/job_7/step_interactive/user/task_0\n", "7"),
    # several slurmd on one host: <node>_slurmstepd.scope
    ("0::/system.slice/gpu-07_slurmstepd.scope/job_99/step_0/user/task_1\n", "99"),
    # cgroup v1: one line per controller, under /slurm/uid_<uid>/
    ("4:devices:/slurm/uid_1000/job_1234/step_0/task_0\n", "1234"),
    (V1_CONTROLLERS.format(job=5678), "5678"),
    ("10:devices:/slurm/uid_2101171/job_280678/step_interactive/task_0\n", "280678"),
    ("4:devices:/slurm_gpu-07/uid_1000/job_31/step_0/task_0\n", "31"),
])
def test_slurm_job_from_its_cgroup(text, job):
    assert parse_slurm_cgroup(text) == job


@pytest.mark.parametrize("text", [
    "",
    "0::/\n",
    "0::/init.scope\n",
    "0::/system.slice/slurmd.service\n",
    "0::/system.slice/slurmstepd.scope/system\n",  # slurmstepd itself
    "0::/user.slice/user-1000.slice/session-3.scope\n",
    "0::/user.slice/job_123/step_0\n",  # job_ under no slurmstepd scope
    "4:devices:/slurm/job_123/step_0\n",  # v1 without uid_
    "0::/system.slice/slurmstepd.scope/job_abc/step_0\n",
    "0::/system.slice/slurmstepd.scope/job_/step_0\n",
    "0::/kubepods.slice/kubepods-pod6b1e1f0e_4d1c_4b7e_9d9a_2f8f1d2c3b4a.slice/"
    "cri-containerd-" + "a" * 64 + ".scope\n",
    "not a cgroup file at all",
])
def test_no_slurm_job_elsewhere(text):
    assert parse_slurm_cgroup(text) is None


def test_the_fake_nodes_host_and_pod_cgroups_are_no_slurm_job():
    for version in ("v1", "v2"):
        assert parse_slurm_cgroup(cgroup_file("/system.slice/nvidia-persistenced.service",
                                              version)) is None
        assert parse_slurm_cgroup(cgroup_file("/kubepods/burstable/pod1234/" + "b" * 64,
                                              version)) is None


def _proc(root, pid: int, text: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(text)


def test_each_pid_gets_its_job_and_others_none(tmp_path):
    _proc(tmp_path, 101, "0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0\n")
    _proc(tmp_path, 102, V1_CONTROLLERS.format(job=1235))
    _proc(tmp_path, 900, "0::/system.slice/nvidia-persistenced.service\n")
    _proc(tmp_path, 901, "x" * (CGROUP_MAX_BYTES + 1))  # bounded: not read
    assert SlurmJobs(tmp_path).jobs([101, 102, 900, 901, 555]) == {101: "1234", 102: "1235"}


def test_pids_are_bounded(tmp_path, caplog):
    for pid in range(1, 11):
        _proc(tmp_path, pid, f"0::/system.slice/slurmstepd.scope/job_{pid}/step_0/user/task_0\n")
    with caplog.at_level(logging.WARNING, logger="otel_gpu.attribute.hpc.slurm"):
        jobs = SlurmJobs(tmp_path, max_pids=4).jobs(range(1, 11))
    assert jobs == {1: "1", 2: "2", 3: "3", 4: "4"}
    assert len(caplog.records) == 1 and "more than 4 GPU processes" in caplog.messages[0]


def test_no_visible_process_is_said_once_an_hour(tmp_path, caplog):
    slurm = SlurmJobs(tmp_path / "proc")
    with caplog.at_level(logging.WARNING, logger="otel_gpu.attribute.hpc.slurm"):
        for _ in range(3):
            assert slurm.jobs([1, 2]) == {}
    assert len(caplog.records) == 1
    assert "none of the 2 GPU process(es)" in caplog.messages[0]
