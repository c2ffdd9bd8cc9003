"""The simulator's kubelet: its hand-written protobuf reads as the API's own messages, and a
scenario's pods are what it serves."""

from __future__ import annotations

import pytest

from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
from otel_gpu.attribute.k8s._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from otel_gpu.sim import ScenarioError, load_scenario
from otel_gpu.sim.kubelet import (
    Container,
    Devices,
    Pod,
    allocatable_reply,
    list_reply,
    scenario_allocatable,
    scenario_pods,
)

PODS = (Pod("train", "ml", (Container("main", (Devices("nvidia.com/gpu", ("GPU-a", "GPU-b"),
                                                         (0, 1)),)),
                            Container("side"))),
        Pod("notebook", "research", (Container("nb", (Devices("nvidia.com/mig-1g.10gb",
                                                              ("MIG-c",)),)),)))


def test_the_wire_format_parses_with_the_apis_stubs():
    reply = v1_pb2.ListPodResourcesResponse.FromString(list_reply(PODS))
    (train, notebook) = reply.pod_resources
    assert (train.name, train.namespace, [c.name for c in train.containers]) == (
        "train", "ml", ["main", "side"])
    (devs,) = train.containers[0].devices
    assert devs.resource_name == "nvidia.com/gpu" and list(devs.device_ids) == ["GPU-a", "GPU-b"]
    assert [n.ID for n in devs.topology.nodes] == [0, 1]
    (mig,) = notebook.containers[0].devices
    assert list(mig.device_ids) == ["MIG-c"] and not mig.HasField("topology")
    old = v1alpha1_pb2.ListPodResourcesResponse.FromString(list_reply(PODS, v1alpha1=True))
    assert [p.name for p in old.pod_resources] == ["train", "notebook"]
    allocatable = v1_pb2.AllocatableResourcesResponse.FromString(
        allocatable_reply([Devices("nvidia.com/gpu", ("GPU-a",), (3,))]))
    assert allocatable.devices[0].topology.nodes[0].ID == 3


def test_the_demo_node_serves_whole_time_sliced_and_mig_devices():
    scenario = load_scenario("demo")
    gpus = scenario.devices
    pods = {(p.namespace, p.name): p for p in scenario_pods(scenario.node)}
    held = {key: [i for c in p.containers for d in c.devices for i in d.ids]
            for key, p in pods.items()}
    assert held[("ml", "train-llama-0")] == [gpus[0].uuid]
    assert held[("research", "notebook-alice")] == [f"{gpus[1].uuid}::0"]
    assert held[("ml", "serve-embed-0")] == [gpus[2].mig[0].uuid]
    assert held[("research", "notebook-carol")] == [gpus[4].uuid] and not gpus[4].processes
    (device,) = pods[("ml", "serve-embed-0")].containers[0].devices
    assert device.resource == "nvidia.com/mig-3g.40gb" and device.numa == (1,)
    assert [c.name for c in scenario.node.containers] == ["jupyter"]
    ids = [i for d in scenario_allocatable(scenario.node, gpus) for i in d.ids]
    assert ids == [gpus[0].uuid, *(f"{gpus[1].uuid}::{r}" for r in range(3)),
                   gpus[2].mig[0].uuid, gpus[2].mig[1].uuid, gpus[3].uuid, gpus[4].uuid]


@pytest.mark.parametrize(("devices", "message"), [
    ("[4]", r"devices\[0\]\.gpu: no GPU 4 \(the scenario has 1\)"),
    ("[{gpu: 0, mig: 3}]", r"devices\[0\]\.mig: GPU 0 has no MIG instance"),
    ("[{gpu: 0, replica: 1, mig: 1}]", r"devices\[0\]: a share of a MIG instance"),
    ("[{gpu: 0, slot: 1}]", r"devices\[0\]\.slot: unknown key"),
])
def test_a_bad_device_reference_names_its_key(tmp_path, devices, message):
    path = tmp_path / "s.yaml"
    path.write_text(f"""\
devices: [{{name: NVIDIA A10}}]
node:
  pods: [{{namespace: ml, name: a, containers: [{{name: main, devices: {devices}}}]}}]
""")
    with pytest.raises(ScenarioError, match=message):
        load_scenario(str(path))
