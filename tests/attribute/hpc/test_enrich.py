"""The job stage and its outputs: merged sources, MIG keys, the OTel attribute, dcgm copies,
and the OTLP Resource per job."""

from __future__ import annotations

import logging
from dataclasses import replace as copy
from types import MappingProxyType

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from otel_gpu.attribute.hpc import enrich
from otel_gpu.attribute.hpc.enrich import JobEnricher, job_enricher, job_order
from otel_gpu.attribute.hpc.mapping import MappingWatcher
from otel_gpu.attribute.hpc.slurm import SlurmJobs
from otel_gpu.config import load
from otel_gpu.export.naming import ProfileOptions
from otel_gpu.export.naming.dcgm import DcgmProfile, default_columns
from otel_gpu.export.naming.exposition import render
from otel_gpu.export.otlp.metrics import PodResourceExporter
from otel_gpu.sample.library import Nvml
from otel_gpu.snapshot import ProcessUsage
from otel_gpu.wiring import sample_once
from otel_gpu.workload import HPC_JOB_ID, JobRef
from testkit.exposition import series
from tests.support.exporters import RecordingExporter
from tests.support.snapshots import GPU0, GPU1, GPU2, MIG_A, MIG_B, MIG_C, sample, sample_node
from tests.support.snapshots import snapshot as make_snapshot

SLURM = "0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"


def refs(*ids: str) -> tuple[JobRef, ...]:
    """The jobs a device carries, by id, in order."""
    return tuple(JobRef(job) for job in ids)


def _node_snapshot(seq: int = 1, processes: dict[str, tuple[int, ...]] | None = None):
    procs = processes or {}
    return make_snapshot(*(
        sample(d, processes=tuple(ProcessUsage(pid) for pid in procs[d.uuid])
               if d.uuid in procs else None)
        for d in sample_node()), seq=seq)


def _said(caplog) -> list[str]:
    """What the job stage itself logged (the mapping watcher says what it reads, too)."""
    return [r.getMessage() for r in caplog.records if r.name == "otel_gpu.attribute.hpc.enrich"]


def _proc(root, pid: int, text: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(text)


def test_files_name_gpus_by_index_and_mig_instances_by_gpu_instance(tmp_path):
    # sample_node: GPU0 index 0, GPU1 index 1 in MIG mode (GIs 1, 2, 3), GPU2 index 2
    (tmp_path / "0").write_text("1001\n")
    (tmp_path / "1").write_text("1100\n")  # the MIG GPU as a whole
    (tmp_path / "1.2").write_text("1102\n1103\n")
    (tmp_path / "1.3").write_text("1103\n")
    snap = JobEnricher(MappingWatcher(tmp_path)).process(_node_snapshot())
    assert dict(snap.jobs) == {
        GPU0: refs("1001"), GPU1: refs("1100"), MIG_B: refs("1102", "1103"), MIG_C: refs("1103")}
    assert snap.series_jobs(MIG_A) == ()  # a MIG instance does not take its GPU's file
    assert snap.series_jobs(GPU2) == ()


def test_cgroups_name_the_jobs_of_each_devices_processes_without_a_file(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 11, SLURM.format(job=2001))
    _proc(proc, 12, SLURM.format(job=2002))
    _proc(proc, 13, "4:devices:/slurm/uid_1000/job_2001/step_1/task_0\n")
    _proc(proc, 14, "0::/user.slice/user-1000.slice/session-3.scope\n")
    snap = _node_snapshot(processes={GPU0: (11, 12), MIG_A: (13,), GPU2: (14,)})
    out = JobEnricher(slurm=SlurmJobs(proc)).process(snap)
    assert dict(out.jobs) == {GPU0: refs("2001", "2002"), MIG_A: refs("2001")}
    assert out.job_pids == {11, 12, 13}  # the session's process is in no job
    mapped = JobEnricher(MappingWatcher(tmp_path)).process(snap)
    assert mapped.job_pids is None  # files only: no process is looked up


def test_both_sources_are_merged_sorted_once_each(tmp_path):
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "0").write_text("1001\nabc\n")
    _proc(tmp_path / "proc", 11, SLURM.format(job=1001))
    _proc(tmp_path / "proc", 12, SLURM.format(job=998))
    stage = job_enricher(str(tmp_path / "map"), str(tmp_path / "proc"), processes=True)
    assert stage is not None
    out = stage.process(_node_snapshot(processes={GPU0: (11, 12)}))
    assert out.jobs[GPU0] == refs("998", "1001", "abc")
    assert sorted(["10", "9", "b", "a", "100"], key=job_order) == ["9", "10", "100", "a", "b"]


def test_off_unless_a_directory_or_process_usage():
    assert job_enricher(None, "/proc", processes=False) is None
    assert job_enricher("", "/proc", processes=False) is None


def test_read_once_per_sample_and_reused_for_republications(tmp_path):
    (tmp_path / "0").write_text("1001\n")
    stage = JobEnricher(MappingWatcher(tmp_path))
    first = stage.process(_node_snapshot(seq=1))
    (tmp_path / "0").write_text("1002\n")
    again = stage.process(_node_snapshot(seq=1))  # the kubelet thread re-publishing sample 1
    assert again.jobs is first.jobs and first.jobs[GPU0] == refs("1001")
    assert stage.process(_node_snapshot(seq=2)).jobs[GPU0] == refs("1002")


def test_a_file_naming_no_device_is_said_and_its_jobs_dropped(tmp_path, caplog):
    (tmp_path / "9").write_text("1\n")
    (tmp_path / "1.7").write_text("2\n")
    stage = JobEnricher(MappingWatcher(tmp_path))
    with caplog.at_level(logging.WARNING, logger="otel_gpu.attribute.hpc.enrich"):
        for seq in (1, 2, 3):
            assert dict(stage.process(_node_snapshot(seq=seq)).jobs) == {}
    assert sorted(_said(caplog)) == [
        "HPC job mapping file 1.7 names no GPU or MIG GPU instance on this node: its jobs "
        "are not shown",
        "HPC job mapping file 9 names no GPU or MIG GPU instance on this node: its jobs "
        "are not shown"]


def test_jobs_per_device_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(enrich, "MAX_JOBS_PER_DEVICE", 3)
    (tmp_path / "0").write_text("".join(f"{n}\n" for n in range(10, 0, -1)))
    joined = JobEnricher(MappingWatcher(tmp_path)).process(_node_snapshot())
    assert joined.jobs[GPU0] == refs("1", "2", "3")


def test_a_bug_keeps_the_last_jobs_and_never_raises(tmp_path, caplog):
    (tmp_path / "0").write_text("1001\n")
    stage = JobEnricher(MappingWatcher(tmp_path))
    assert stage.process(_node_snapshot(seq=1)).jobs[GPU0] == refs("1001")

    def broken():
        raise RuntimeError("boom")

    stage.mapping.jobs = broken  # type: ignore[union-attr]
    with caplog.at_level(logging.ERROR, logger="otel_gpu.attribute.hpc.enrich"):
        assert stage.process(_node_snapshot(seq=2)).jobs[GPU0] == refs("1001")
    assert _said(caplog) == ["reading HPC jobs failed; keeping the jobs last read"]


# --- outputs ---------------------------------------------------------------------------------


def _with_jobs(jobs: dict[str, tuple[str, ...]]):
    return make_snapshot(*(sample(d, values={"temp.gpu": 40.0}) for d in sample_node()),
                         jobs=MappingProxyType({uuid: refs(*ids) for uuid, ids in jobs.items()}))


def test_the_otel_attribute_names_every_job_on_one_series():
    snap = _with_jobs({GPU0: ("1001",), GPU2: ("1002", "1003")})
    assert snap.workload_attributes(GPU0) == {HPC_JOB_ID: "1001"}
    assert snap.workload_attributes(GPU2) == {HPC_JOB_ID: "1002,1003"}
    assert snap.workload_attributes(MIG_A) == {}
    assert make_snapshot(sample(sample_node()[0])).workload_attributes(GPU0) == {}


def test_dcgm_has_hpc_job_and_a_copy_per_job_as_dcgm_exporter_does():
    snap = _with_jobs({GPU0: ("1001",), GPU2: ("1002", "1003"), MIG_B: ("1104",)})
    text = render(DcgmProfile(default_columns(), ProfileOptions("h")).families(snap))
    temps = series(text, "DCGM_FI_DEV_GPU_TEMP")
    by_gpu: dict[str, list[str | None]] = {}
    for labels, _ in temps:
        by_gpu.setdefault(f"{labels['gpu']}.{labels.get('GPU_I_ID', '')}", []).append(
            labels.get("hpc_job"))
    assert by_gpu == {"0.": ["1001"], "2.": ["1002", "1003"],
                      "1.1": [None], "1.2": ["1104"], "1.3": [None]}


def test_otlp_sends_each_jobs_series_under_a_job_resource():
    node = Resource({"service.name": "otel-gpu", "host.name": "gpu-07"})
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=node)
    provider.get_meter("otel_gpu").create_observable_gauge("hw.power", [lambda o: [
        Observation(300.0, {"hw.id": "GPU-0", HPC_JOB_ID: "1001"}),
        Observation(200.0, {"hw.id": "GPU-1", HPC_JOB_ID: "1001"}),
        Observation(100.0, {"hw.id": "GPU-2"}),
    ]], unit="W")
    data = reader.get_metrics_data()
    provider.shutdown()
    inner = RecordingExporter()
    out = PodResourceExporter(inner, node).regroup(data)
    assert inner.exported == []  # regrouped only
    groups = {rm.resource.attributes.get(HPC_JOB_ID): rm for rm in out.resource_metrics}
    assert set(groups) == {None, "1001"}
    job = groups["1001"]
    assert job.resource.attributes["host.name"] == "gpu-07"
    points = [p for sm in job.scope_metrics for m in sm.metrics for p in m.data.data_points]
    assert sorted(dict(p.attributes)["hw.id"] for p in points) == ["GPU-0", "GPU-1"]
    assert all(HPC_JOB_ID not in p.attributes for p in points)
    assert out.resource_metrics[0] is groups[None]


# --- wiring ----------------------------------------------------------------------------------


def test_check_shows_the_jobs_of_both_sources_on_bare_metal(fake_nvml, tmp_path):
    fake_nvml(f"""\
        name: two
        devices:
          - {{name: NVIDIA H100 80GB HBM3, uuid: {GPU0}, processes: [{{pid: 11}}]}}
          - {{name: NVIDIA H100 80GB HBM3, uuid: {GPU1}}}
        """)
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "1").write_text("3001\n")
    _proc(tmp_path / "proc", 11, SLURM.format(job=3000))
    nvml = Nvml()
    nvml.init()
    config = load({"pod_attribution": "false", "process_usage": "true",
                   "proc_root": str(tmp_path / "proc"),
                   "hpc_job_mapping_dir": str(tmp_path / "map")}, environ={})
    snap = sample_once(config, nvml)
    assert dict(snap.jobs) == {GPU0: refs("3000"), GPU1: refs("3001")}
    assert snap.pods is None


def test_a_mig_instance_without_a_gpu_instance_id_never_takes_its_gpus_file(tmp_path):
    (tmp_path / "1").write_text("1100\n")
    devices = [copy(d, gpu_instance_id=None) if d.uuid == MIG_A else d for d in sample_node()]
    snap = make_snapshot(*(sample(d) for d in devices))
    assert dict(JobEnricher(MappingWatcher(tmp_path)).process(snap).jobs) == {GPU1: refs("1100")}
