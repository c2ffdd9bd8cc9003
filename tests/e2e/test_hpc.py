"""HPC job attribution through the real otel-gpu process: mapping files, Slurm cgroups, OTLP.

The mapping directory has dcgm-exporter's format (a file per GPU index, or
``<index>.<gpu instance id>`` per MIG instance, a job id a line). The Slurm
case has no mapping file and no kubelet: each GPU process's cgroup, under a
fake ``/proc``, names its job.
"""

from __future__ import annotations

from pathlib import Path

from testkit.exposition import series
from testkit.otlp_receiver import resource_groups
from testkit.process import wait_until

JOB = "nvidia.gpu.hpc.job.id"
OTEL_JOB = "nvidia_gpu_hpc_job_id"
FAST_EXPORT = {"OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}


def _dcgm_jobs(text: str) -> dict[str, list[str | None]]:
    """``gpu.gpu_instance`` -> the hpc_job of each copy of its DCGM_FI_DEV_FB_USED series."""
    out: dict[str, list[str | None]] = {}
    for labels, _ in series(text, "DCGM_FI_DEV_FB_USED"):
        key = f"{labels['gpu']}.{labels.get('GPU_I_ID', '')}".rstrip(".")
        out.setdefault(key, []).append(labels.get("hpc_job"))
    return {k: sorted(v, key=str) for k, v in out.items()}


def _otel_jobs(text: str) -> dict[str, str | None]:
    """``index[.gpu_instance]`` -> the job attribute of its hw.gpu.memory.usage series."""
    out: dict[str, str | None] = {}
    for labels, _ in series(text, "hw_gpu_memory_usage_bytes"):
        key = labels["nvidia_gpu_index"]
        if labels.get("nvidia_gpu_mig_gpu_instance_id"):
            key += "." + labels["nvidia_gpu_mig_gpu_instance_id"]
        assert key not in out, f"{key} has more than one series"
        out[key] = labels.get(OTEL_JOB) or None  # an absent attribute is written empty
    return out


def _mapping(directory: Path, files: dict[str, str]) -> None:
    """What a prolog leaves: the files named here, and no others."""
    directory.mkdir(exist_ok=True)
    for old in directory.iterdir():
        if old.name not in files:
            old.unlink()
    for name, text in files.items():
        tmp = directory / f".{name}.tmp"  # written aside and renamed, as a careful prolog does
        tmp.write_text(text)
        tmp.rename(directory / name)


def test_mapping_files_label_gpus_and_mig_instances_in_both_namings(collector, tmp_path):
    # a100-mig: GPU 0 in MIG mode (GPU instances 1, 5, 13, 14), GPUs 1 and 2 whole
    jobs = tmp_path / "jobs"
    _mapping(jobs, {"0": "700\n", "0.1": "501\n", "0.5": "502\n503\n", "1": "601\n",
                    "README": "not a mapping file\n"})
    proc = collector("--simulate", "a100-mig", "--naming", "otel,dcgm",
                     "--pod-attribution", "false", "--hpc-job-mapping-dir", str(jobs))

    def labelled(dcgm: dict, otel: dict):
        def check():
            text = proc.metrics()
            return text if (_dcgm_jobs(text), _otel_jobs(text)) == (dcgm, otel) else None
        return check

    # dcgm: as dcgm-exporter, one copy of a device's series per job; a MIG GPU is shown
    # through its instances, each with its own file's jobs
    first_dcgm = {"0.1": ["501"], "0.5": ["502", "503"], "0.13": [None], "0.14": [None],
                  "1": ["601"], "2": [None]}
    # otel: one series per device, its jobs in one attribute
    first_otel = {"0": "700", "0.1": "501", "0.5": "502,503", "0.13": None, "0.14": None,
                  "1": "601", "2": None}
    text = wait_until(labelled(first_dcgm, first_otel), 20, "the first jobs")
    assert 'hpc_job="502"' in text and f'{OTEL_JOB}="502,503"' in text

    # the next job's prolog and the last one's epilog: picked up within a few samples
    _mapping(jobs, {"0.1": "504\n", "0.5": "502\n503\n", "2": "602\n"})
    wait_until(labelled(
        {"0.1": ["504"], "0.5": ["502", "503"], "0.13": [None], "0.14": [None],
         "1": [None], "2": ["602"]},
        {"0": None, "0.1": "504", "0.5": "502,503", "0.13": None, "0.14": None,
         "1": None, "2": "602"}), 20, "the changed jobs")
    assert "does not exist" not in proc.log and "Traceback" not in proc.log


GIB = 1 << 30
GPU_A = "GPU-5a5a7118-e550-79a1-597e-7631e126c57a"
GPU_B = "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"
GPU_C = "GPU-0c9d1a3e-1111-2222-3333-444455556666"
SLURM_NODE = f"""\
name: slurm-node
devices:
  - name: NVIDIA H100 80GB HBM3
    uuid: {GPU_A}
    memory: {{total: {80 * GIB}, used: {3 * GIB}}}
    processes:
      - {{pid: 101, used_memory: {GIB}}}
      - {{pid: 102, used_memory: {2 * GIB}}}
  - name: NVIDIA H100 80GB HBM3
    uuid: {GPU_B}
    memory: {{total: {80 * GIB}, used: {3 * GIB}}}
    processes:
      - {{pid: 201, used_memory: {2 * GIB}}}
      - {{pid: 900, used_memory: {GIB}}}
  - name: NVIDIA H100 80GB HBM3
    uuid: {GPU_C}
    memory: {{total: {80 * GIB}, used: 0}}
"""
CGROUPS = {
    # job 1234 (cgroup v2) spans GPUs A and B; job 1235 (cgroup v1) shares GPU A
    101: "0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0\n",
    201: "0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_1\n",
    102: "12:pids:/slurm/uid_1000/job_1235/step_batch/task_0\n"
         "4:devices:/slurm/uid_1000/job_1235/step_batch/task_0\n"
         "1:name=systemd:/system.slice/slurmd.service\n0::/\n",
    900: "0::/system.slice/nvidia-persistenced.service\n",  # a host daemon: no job
}


def test_slurm_cgroups_label_each_processes_gpu_with_no_file_and_no_kubelet(collector, tmp_path):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SLURM_NODE)
    proc_root = tmp_path / "proc"
    for pid, text in CGROUPS.items():
        (proc_root / str(pid)).mkdir(parents=True)
        (proc_root / str(pid) / "cgroup").write_text(text)
    proc = collector("--simulate", str(scenario), "--naming", "otel,dcgm",
                     "--pod-attribution", "false", "--process-usage", "true",
                     "--proc-root", str(proc_root))

    def labelled():
        text = proc.metrics()
        otel = {labels["hw_id"]: labels.get(OTEL_JOB) or None
                for labels, _ in series(text, "hw_gpu_memory_usage_bytes")}
        return (text, otel) if otel.get(GPU_A) and otel.get(GPU_B) else None

    text, otel = wait_until(labelled, 20, "job attributes from the processes' cgroups")
    assert otel == {GPU_A: "1234,1235", GPU_B: "1234", GPU_C: None}
    dcgm = {}
    for labels, _ in series(text, "DCGM_FI_DEV_FB_USED"):
        dcgm.setdefault(labels["UUID"], []).append(labels.get("hpc_job"))
    assert {k: sorted(v, key=str) for k, v in dcgm.items()} == {
        GPU_A: ["1234", "1235"], GPU_B: ["1234"], GPU_C: [None]}
    # the processes are counted on bare metal too
    assert {labels["hw_id"]: v for labels, v in series(text, "nvidia_gpu_processes")} == {
        GPU_A: 2.0, GPU_B: 2.0, GPU_C: 0.0}
    assert "Traceback" not in proc.log


def test_otlp_sends_a_jobs_series_under_a_resource_naming_the_job(collector, receiver, tmp_path):
    jobs = tmp_path / "jobs"
    _mapping(jobs, {"1": "601\n", "2": "602\n"})
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, **FAST_EXPORT}
    # pod attribution left on, with no kubelet on this node: the pod stage, then the job stage
    collector("--simulate", "a100-mig", "--hpc-job-mapping-dir", str(jobs),
              "--kubelet-socket", str(tmp_path / "no-kubelet.sock"), env=env, interval="1h")

    def with_jobs(req) -> bool:
        return {g.get(JOB) for g in resource_groups(req)} == {None, "601", "602"}

    (req,) = receiver.wait_for(with_jobs, timeout=30)
    groups = resource_groups(req)
    assert len(groups) == 3
    for group in groups:
        assert group["service.name"] == "otel-gpu" and "k8s.pod.name" not in group
    power = {(r.resource.get(JOB), r.attributes["nvidia.gpu.index"])
             for r in req.rows() if r.metric == "hw.power"}
    assert power == {("601", 1), ("602", 2), (None, 0)}
    assert all(JOB not in r.attributes for r in req.rows())
