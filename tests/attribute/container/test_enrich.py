"""The container stage: processes to containers, once per sample, and what the snapshot says."""

from __future__ import annotations

from types import MappingProxyType

from otel_gpu.attribute.container.enrich import ContainerEnricher, container_enricher
from otel_gpu.attribute.container.runtime import RuntimeState
from otel_gpu.attribute.enrich import Enricher
from otel_gpu.snapshot import Attribution, Pods, PodUsage, ProcessUsage
from otel_gpu.workload import ContainerRef
from tests.support.snapshots import GPU0, GPU1, gpu_device, sample, snapshot
from tests.support.sources import StaticRuntime

A = "a" * 64
B = "b" * 64
TRAINER = ContainerRef(A, "trainer", "pytorch/pytorch")


def _proc_root(tmp_path, **cgroups: str):
    for pid, text in cgroups.items():
        (tmp_path / pid.lstrip("p")).mkdir()
        (tmp_path / pid.lstrip("p") / "cgroup").write_text(text)
    return tmp_path


def _node(seq: int = 1):
    whole = sample(gpu_device(GPU0), processes=(ProcessUsage(11, 100, 0.5),),
                   process_utilization=True)
    shared = sample(gpu_device(GPU1), processes=(ProcessUsage(12, 10, 0.1),
                                                 ProcessUsage(13, 20, 0.2),
                                                 ProcessUsage(14, 5, 0.0)),
                    process_utilization=True)
    return snapshot(whole, shared, seq=seq)


def test_devices_and_usage_per_container(tmp_path):
    root = _proc_root(tmp_path, p11=f"0::/system.slice/docker-{A}.scope\n",
                      p12=f"0::/docker/{A}\n", p13=f"0::/machine.slice/libpod-{B}.scope\n",
                      p14="0::/user.slice/user-1000.slice/session-2.scope\n")
    state = RuntimeState(MappingProxyType({A: TRAINER}), 1.0)
    stage = ContainerEnricher(StaticRuntime(state), root)
    assert isinstance(stage, Enricher)
    joined = stage.process(_node())
    assert joined.series_containers(GPU0) == (TRAINER,)
    assert joined.workload_attributes(GPU0) == {"container.id": A, "container.name": "trainer",
                                                "container.image.name": "pytorch/pytorch"}
    assert joined.series_containers(GPU1) == ()  # two containers: neither on its series
    assert joined.containers.devices[GPU1] == (ContainerRef(B), TRAINER)
    assert [(r.uuid, r.pod, r.used_memory, r.processes) for r in joined.usage()] == [
        (GPU0, TRAINER, 100, 1),
        (GPU1, ContainerRef(B), 20, 1),
        (GPU1, TRAINER, 10, 1),
        (GPU1, None, 5, 1),
    ]


def test_read_once_per_sample_and_off_without_a_socket(tmp_path):
    root = _proc_root(tmp_path, p11=f"0::/docker/{A}\n")
    source = StaticRuntime(RuntimeState(MappingProxyType({A: TRAINER}), 1.0))
    stage = ContainerEnricher(source, root)
    first = stage.process(_node(seq=1))
    (tmp_path / "11" / "cgroup").write_text("0::/\n")
    assert stage.process(first).containers is first.containers  # a re-publication
    assert stage.process(_node(seq=2)).series_containers(GPU0) == ()
    source.state = None  # the socket went: off, the snapshot as it was
    plain = _node(seq=3)
    assert stage.process(plain) is plain


def test_the_pods_usage_stands_where_the_kubelet_answers(tmp_path):
    root = _proc_root(tmp_path, p11=f"0::/docker/{A}\n")
    runtime = StaticRuntime(RuntimeState(MappingProxyType({A: TRAINER}), 1.0))
    stage = ContainerEnricher(runtime, root)
    pods_row = PodUsage(GPU0, None, 1, 100)
    node = _node()
    from dataclasses import replace

    joined = stage.process(replace(node, pods=Pods(Attribution(), usage=(pods_row,))))
    assert joined.usage() == (pods_row,)
    assert joined.series_containers(GPU0) == (TRAINER,)


def test_the_stage_is_on_with_process_usage_only():
    assert container_enricher("/nope.sock", "/proc", interval=1.0, processes=False) is None
    stage = container_enricher("/nope.sock", "/proc", interval=1.0, processes=True)
    assert stage is not None
    node = _node()
    assert stage.process(node) is node  # no socket: not polled yet, nothing attached
