"""The workload Resource shared by the OTLP metrics and logs."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource

from otel_gpu.export.otlp.resources import WorkloadResources
from otel_gpu.workload import HPC_JOB_ID

NODE = Resource({"service.name": "otel-gpu", "k8s.node.name": "node-1"})
POD = {"k8s.pod.name": "train-0", "k8s.namespace.name": "ml", "k8s.container.name": "main"}


def test_a_workload_gets_the_nodes_resource_plus_its_attributes_made_once():
    workloads = WorkloadResources()
    key = workloads.key({**POD, "hw.id": "GPU-0"})
    resource = workloads.resource(NODE, key)
    assert dict(resource.attributes) == {**dict(NODE.attributes), **POD}
    assert workloads.resource(NODE, workloads.key(dict(POD))) is resource
    assert workloads.strip({**POD, "hw.id": "GPU-0"}) == {"hw.id": "GPU-0"}


def test_no_workload_is_the_node_itself_and_the_cache_is_bounded():
    workloads = WorkloadResources(cache=2)
    assert workloads.key({"hw.id": "GPU-0"}) == ()
    assert workloads.resource(NODE, ()) is NODE
    for n in range(5):
        workloads.resource(NODE, workloads.key({"k8s.pod.name": f"p{n}"}))
    assert len(workloads._resources) <= 2


def test_a_job_and_a_pod_share_one_resource():
    workloads = WorkloadResources()
    key = workloads.key({"k8s.pod.name": "p", HPC_JOB_ID: "42"})
    attrs = dict(workloads.resource(NODE, key).attributes)
    assert attrs["k8s.pod.name"] == "p" and attrs[HPC_JOB_ID] == "42"
