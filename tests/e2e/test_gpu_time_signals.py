"""The GPU time ledger's two signals off Kubernetes: the real process, real sockets, a fake node.

Held but idle (``nvidia.gpu.{container,hpc}.idle.duration`` and the record
``nvidia.gpu.allocation.idle``) and used outside any allocation
(``nvidia.gpu.outside.use``, ``nvidia.gpu.time.outside`` and the record
``nvidia.gpu.outside_allocation``), on a Docker host and on a Slurm node. The
Kubernetes layout has them in the demo's tests (tests/e2e/test_demo.py).

Each layout's collector serves ``/metrics`` and sends OTLP to a receiver at once,
so one run shows both the series and the records.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.exposition import series
from testkit.process import wait_until

GIB = 1 << 30
FAST = {"OTEL_METRIC_EXPORT_INTERVAL": "500", "OTEL_EXPORTER_OTLP_TIMEOUT": "5"}
IDLE = "nvidia.gpu.allocation.idle"
OUTSIDE = "nvidia.gpu.outside_allocation"
KIND = "nvidia.gpu.outside.kind"
PHASE = "nvidia.gpu.event.phase"
USER_SESSION = "0::/user.slice/user-1000.slice/session-4.scope\n"
"""Someone logged in and ran a process on a GPU by hand: no container, no job."""

GPU_BUSY = "GPU-7e0a0001-0000-4000-8000-00000000a001"
GPU_STUCK = "GPU-7e0a0001-0000-4000-8000-00000000a002"
GPU_FREE = "GPU-7e0a0001-0000-4000-8000-00000000a003"
GPU_MIXED = "GPU-7e0a0001-0000-4000-8000-00000000a004"


def _write_proc(root: Path, cgroups: dict[int, str]) -> Path:
    for pid, text in cgroups.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return root


def _outside_now(text: str) -> set[tuple[str, str]]:
    """(device, kind) of each ``nvidia.gpu.outside.use`` series at 1."""
    return {(lab["hw_id"], lab["nvidia_gpu_outside_kind"])
            for lab, value in series(text, "nvidia_gpu_outside_use") if value == 1}


def _device_counter(text: str, name: str, uuid: str) -> float:
    (value,) = [v for _, v in series(text, name, hw_id=uuid)]
    return value


def _starts(receiver, name: str) -> list:
    return [r for r in receiver.log_records()
            if r.event_name == name and r.attributes.get(PHASE) == "start"]


# --- a Docker host: containers outside Kubernetes, no kubelet --------------------------------

TRAINER = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
NOTEBOOK = "a1b2c3d4" * 8
LLM = "c0ffee" + "0" * 58
DOCKER_HOST = f"""\
name: docker-host
devices:
  - name: NVIDIA A10
    uuid: {GPU_BUSY}
    memory: {{total: {24 * GIB}, used: {2 * GIB}}}
    utilization: {{gpu: 60, memory: 15}}
    processes: [{{pid: 501, used_memory: {2 * GIB}, sm: 60, memory_util: 15}}]
  - name: NVIDIA A10
    uuid: {GPU_STUCK}
    memory: {{total: {24 * GIB}, used: {4 * GIB}}}
    utilization: {{gpu: 0, memory: 0}}
    processes: [{{pid: 511, used_memory: {4 * GIB}, sm: 0, memory_util: 0}}]
  - name: NVIDIA A10
    uuid: {GPU_FREE}
    memory: {{total: {24 * GIB}, used: {1 * GIB}}}
    utilization: {{gpu: 40, memory: 5}}
    processes: [{{pid: 900, used_memory: {1 * GIB}, sm: 40, memory_util: 5}}]
  - name: NVIDIA A10
    uuid: {GPU_MIXED}
    memory: {{total: {24 * GIB}, used: {4 * GIB}}}
    utilization: {{gpu: 55, memory: 20}}
    processes:
      - {{pid: 601, used_memory: {3 * GIB}, sm: 45, memory_util: 15}}
      - {{pid: 901, used_memory: {1 * GIB}, sm: 10, memory_util: 5}}
"""
DOCKER_CGROUPS = {
    501: f"0::/system.slice/docker-{TRAINER}.scope\n",
    511: f"0::/system.slice/docker-{NOTEBOOK}.scope\n",
    601: f"0::/system.slice/docker-{LLM}.scope\n",
    900: USER_SESSION,
    901: "0::/system.slice/ollama.service\n",
}


def _containers(text: str, metric: str) -> dict[tuple[str, str], float]:
    """(device, container name) -> the value of each of ``metric``'s container series."""
    return {(lab["hw_id"], lab["container_name"]): value for lab, value in series(text, metric)}


@pytest.mark.slow  # seconds of real time (an idle threshold to pass, a real receiver)
def test_docker_host_idle_container_and_use_outside_any_container(
        collector, receiver, tmp_path):
    """What a Docker host can show. The runtime's API does not say which GPUs a container
    was given, so a container holds a GPU only while its processes run there: "held with
    no process on it" cannot be seen (a container whose last process ends no longer holds
    the GPU), nor can ``other_workload`` (a container whose process runs on a GPU holds it
    too). What can be seen: a container's time on its GPU; a container whose process sits
    on its GPU with no activity is idle, past the threshold one record under the
    container's Resource; a process on a GPU no container uses is ``unallocated_device``;
    a host process beside a container's is ``host``."""
    from tests.support.container_runtime import FakeRuntime, docker_container

    with FakeRuntime() as runtime:  # the Docker API, answering for as long as the test runs
        runtime.set_containers([docker_container(TRAINER, "trainer", "pytorch/pytorch:2.3.1"),
                                docker_container(NOTEBOOK, "notebook", "jupyter/base:2024"),
                                docker_container(LLM, "llm", "ollama/ollama:0.5.7")])
        scenario = tmp_path / "docker.yaml"
        scenario.write_text(DOCKER_HOST)
        proc_root = _write_proc(tmp_path / "proc", DOCKER_CGROUPS)
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, **FAST}
        proc = collector("--simulate", str(scenario), "--kubelet-socket",
                         str(tmp_path / "no-kubelet.sock"), "--process-usage", "true",
                         "--proc-root", str(proc_root), "--container-socket", runtime.socket_path,
                         "--idle-threshold", "2s", env=env)

        def idle_past_threshold():
            text = proc.metrics()
            idle = _containers(text, "nvidia_gpu_container_idle_duration_seconds")
            return text if idle.get((GPU_STUCK, "notebook"), 0) >= 2.0 else None

        text = str(wait_until(idle_past_threshold, 15, "the notebook container idle for 2 s"))
        # one row per container on its GPU; only the one with no activity is idle
        idle = _containers(text, "nvidia_gpu_container_idle_duration_seconds")
        assert set(idle) == {(GPU_BUSY, "trainer"), (GPU_STUCK, "notebook"), (GPU_MIXED, "llm")}
        assert idle[(GPU_BUSY, "trainer")] == 0 and idle[(GPU_MIXED, "llm")] == 0
        allocated = _containers(text, "nvidia_gpu_container_time_allocated_seconds_total")
        active = _containers(text, "nvidia_gpu_container_time_active_seconds_total")
        assert allocated[(GPU_BUSY, "trainer")] > 1.0
        # alone on a whole GPU: its activity is the device's utilization, 60 %
        assert active[(GPU_BUSY, "trainer")] == pytest.approx(
            0.6 * allocated[(GPU_BUSY, "trainer")], rel=1e-3)
        assert allocated[(GPU_STUCK, "notebook")] > 1.0 and active[(GPU_STUCK, "notebook")] == 0
        # beside a host process: its own SM share, 45 %
        assert active[(GPU_MIXED, "llm")] == pytest.approx(
            0.45 * allocated[(GPU_MIXED, "llm")], rel=1e-3)
        # use outside any container: exactly these two, by kind
        assert _outside_now(text) == {(GPU_FREE, "unallocated_device"), (GPU_MIXED, "host")}
        assert _device_counter(text, "nvidia_gpu_time_outside_seconds_total", GPU_FREE) > 0.5
        assert _device_counter(text, "nvidia_gpu_time_outside_seconds_total", GPU_BUSY) == 0
        assert _device_counter(text, "nvidia_gpu_time_unallocated_seconds_total", GPU_FREE) > 1.0
        assert _device_counter(text, "nvidia_gpu_time_unallocated_seconds_total", GPU_BUSY) == 0

        receiver.wait_for_logs(lambda r: r.event_name == IDLE, timeout=10)
        receiver.wait_for_logs(lambda r: r.event_name == OUTSIDE, timeout=10, count=2)
        (idle_record,) = _starts(receiver, IDLE)
        assert idle_record.resource["container.name"] == "notebook"
        assert idle_record.resource["container.id"] == NOTEBOOK
        assert "container.name" not in idle_record.attributes  # the Resource's, not the point's
        assert idle_record.attributes["hw.id"] == GPU_STUCK
        assert idle_record.attributes["nvidia.gpu.idle.duration"] >= 2.0
        assert idle_record.severity_text == "WARN"
        outside = {(r.attributes["hw.id"], r.attributes[KIND]): r
                   for r in _starts(receiver, OUTSIDE)}
        assert set(outside) == {(GPU_FREE, "unallocated_device"), (GPU_MIXED, "host")}
        # a GPU no container uses: the node's Resource; one the llm container uses: the llm's
        assert "container.name" not in outside[(GPU_FREE, "unallocated_device")].resource
        assert outside[(GPU_MIXED, "host")].resource["container.name"] == "llm"
        assert "Traceback" not in proc.log


# --- a Slurm node: the job mapping directory and Slurm's cgroups, no kubelet ----------------

A100 = "NVIDIA A100-SXM4-80GB"
JOB_IDLE, JOB_BUSY, JOB_MIXED = "700", "1234", "1235"
RESUMES_AT = 40
"""The sample from which the idle job runs a process on its GPU: long past the threshold."""
RESUMED = [0] * (RESUMES_AT - 1) + [50] * 500
"""GPU 0's utilization per sample: none until the job's process starts, then 50 %."""
SLURM_NODE = f"""\
name: slurm-node
devices:
  - name: {A100}
    uuid: {GPU_STUCK}
    memory: {{total: {80 * GIB}, used: 0}}
    utilization: {{gpu: {RESUMED}, memory: 0}}
    processes: [{{pid: 701, used_memory: {GIB}, sm: 50, from_sample: {RESUMES_AT}}}]
  - name: {A100}
    uuid: {GPU_BUSY}
    memory: {{total: {80 * GIB}, used: {4 * GIB}}}
    utilization: {{gpu: 80, memory: 30}}
    processes: [{{pid: 101, used_memory: {4 * GIB}, sm: 80, memory_util: 30}}]
  - name: {A100}
    uuid: {GPU_FREE}
    memory: {{total: {80 * GIB}, used: {GIB}}}
    utilization: {{gpu: 40, memory: 5}}
    processes: [{{pid: 900, used_memory: {GIB}, sm: 40, memory_util: 5}}]
  - name: {A100}
    uuid: {GPU_MIXED}
    memory: {{total: {80 * GIB}, used: {3 * GIB}}}
    utilization: {{gpu: 70, memory: 20}}
    processes:
      - {{pid: 102, used_memory: {2 * GIB}, sm: 50, memory_util: 15}}
      - {{pid: 901, used_memory: {GIB}, sm: 20, memory_util: 5}}
"""
SLURM_CGROUPS = {
    701: f"0::/system.slice/slurmstepd.scope/job_{JOB_IDLE}/step_0/user/task_0\n",
    101: f"0::/system.slice/slurmstepd.scope/job_{JOB_BUSY}/step_0/user/task_0\n",
    102: f"12:pids:/slurm/uid_1000/job_{JOB_MIXED}/step_batch/task_0\n"
         f"4:devices:/slurm/uid_1000/job_{JOB_MIXED}/step_batch/task_0\n0::/\n",
    900: USER_SESSION,
    901: USER_SESSION,
}


def _jobs(text: str, metric: str) -> dict[tuple[str, str], float]:
    """(device, job id) -> the value of each of ``metric``'s job series."""
    return {(lab["hw_id"], lab["nvidia_gpu_hpc_job_id"]): value
            for lab, value in series(text, metric)}


@pytest.fixture(params=[False, True], ids=["slurm", "slurm-and-docker"])
def container_socket(request, tmp_path):
    """No Docker on the node, or a Docker socket answering with no container."""
    if not request.param:
        yield str(tmp_path / "no-docker.sock")
        return
    from tests.support.container_runtime import FakeRuntime

    with FakeRuntime() as fake:
        yield fake.socket_path


@pytest.mark.slow  # seconds of real time (an idle threshold to pass, a real receiver)
def test_slurm_job_holding_a_gpu_with_no_process_and_use_outside_any_job(
        collector, receiver, tmp_path, container_socket):
    """Slurm's prolog names GPU 0 for job 700 in the mapping directory, and the job runs
    nothing there (its cgroup has no process on it: the case exporters reading processes
    only cannot see): its idle gauge grows, past the threshold one record under the job's
    Resource, and one more when a process of the job starts there. Job 1234's process on
    GPU 1 (from its cgroup alone, no mapping file) keeps it busy. A process in no job on a
    GPU no job holds is ``unallocated_device``; beside job 1235's on GPU 3, ``host``. The
    same where a Docker socket answers too (its row of processes in no container then
    holds the jobs' processes as well, which are not outside use)."""
    scenario = tmp_path / "slurm.yaml"
    scenario.write_text(SLURM_NODE)
    proc_root = _write_proc(tmp_path / "proc", SLURM_CGROUPS)
    jobs = tmp_path / "jobs"  # what the prolog wrote: GPU 0 is job 700's
    jobs.mkdir()
    (jobs / "0").write_text(f"{JOB_IDLE}\n")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, **FAST}
    proc = collector("--simulate", str(scenario), "--pod-attribution", "false",
                     "--process-usage", "true", "--proc-root", str(proc_root),
                     "--hpc-job-mapping-dir", str(jobs), "--container-socket", container_socket,
                     "--idle-threshold", "2s", env=env)

    def idle_past_threshold():
        text = proc.metrics()
        idle = _jobs(text, "nvidia_gpu_hpc_idle_duration_seconds")
        return text if idle.get((GPU_STUCK, JOB_IDLE), 0) >= 2.0 else None

    text = str(wait_until(idle_past_threshold, 15, "job 700 idle on GPU 0 for 2 s"))
    idle = _jobs(text, "nvidia_gpu_hpc_idle_duration_seconds")
    assert set(idle) == {(GPU_STUCK, JOB_IDLE), (GPU_BUSY, JOB_BUSY), (GPU_MIXED, JOB_MIXED)}
    assert idle[(GPU_BUSY, JOB_BUSY)] == 0 and idle[(GPU_MIXED, JOB_MIXED)] == 0
    allocated = _jobs(text, "nvidia_gpu_hpc_time_allocated_seconds_total")
    active = _jobs(text, "nvidia_gpu_hpc_time_active_seconds_total")
    assert allocated[(GPU_STUCK, JOB_IDLE)] > 1.0 and active[(GPU_STUCK, JOB_IDLE)] == 0
    assert active[(GPU_BUSY, JOB_BUSY)] == pytest.approx(
        0.8 * allocated[(GPU_BUSY, JOB_BUSY)], rel=1e-3)
    assert _outside_now(text) == {(GPU_FREE, "unallocated_device"), (GPU_MIXED, "host")}
    outside_s = {uuid: _device_counter(text, "nvidia_gpu_time_outside_seconds_total", uuid)
                 for uuid in (GPU_STUCK, GPU_BUSY, GPU_FREE, GPU_MIXED)}
    assert outside_s[GPU_STUCK] == outside_s[GPU_BUSY] == 0  # the jobs' own processes
    assert outside_s[GPU_FREE] > 0.5
    # beside job 1235's process: the host process's own 20 % of the GPU-seconds counted
    counted = allocated[(GPU_MIXED, JOB_MIXED)]
    assert outside_s[GPU_MIXED] == pytest.approx(0.2 * counted, rel=0.05)
    assert _device_counter(text, "nvidia_gpu_time_unallocated_seconds_total", GPU_STUCK) == 0

    (start,) = receiver.wait_for_logs(lambda r: r.event_name == IDLE, timeout=10)
    assert start.resource["nvidia.gpu.hpc.job.id"] == JOB_IDLE
    assert "nvidia.gpu.hpc.job.id" not in start.attributes
    assert start.attributes["hw.id"] == GPU_STUCK and start.attributes[PHASE] == "start"
    assert start.attributes["nvidia.gpu.idle.duration"] >= 2.0
    receiver.wait_for_logs(lambda r: r.event_name == OUTSIDE, timeout=10, count=2)
    outside = {(r.attributes["hw.id"], r.attributes[KIND]): r
               for r in _starts(receiver, OUTSIDE)}
    assert set(outside) == {(GPU_FREE, "unallocated_device"), (GPU_MIXED, "host")}
    assert "nvidia.gpu.hpc.job.id" not in outside[(GPU_FREE, "unallocated_device")].resource
    assert outside[(GPU_MIXED, "host")].resource["nvidia.gpu.hpc.job.id"] == JOB_MIXED

    # the job's process starts on its GPU: the idle episode ends, under the same Resource
    (end,) = receiver.wait_for_logs(
        lambda r: r.event_name == IDLE and r.attributes[PHASE] == "end", timeout=20)
    assert end.resource["nvidia.gpu.hpc.job.id"] == JOB_IDLE
    assert end.severity_text == "INFO" and "uses it again" in end.body
    assert end.attributes["nvidia.gpu.event.duration"] > 2.0
    assert _jobs(proc.metrics(), "nvidia_gpu_hpc_idle_duration_seconds")[
        (GPU_STUCK, JOB_IDLE)] == 0
    assert [r.event_name for r in receiver.log_records()].count(IDLE) == 2
    assert "Traceback" not in proc.log
