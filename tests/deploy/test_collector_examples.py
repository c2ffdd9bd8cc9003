"""The OpenTelemetry Collector examples: configurations whose pipelines name only
defined components, and Kubernetes objects that validate and grant what
k8sattributes needs."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.helpers import ROOT, assert_valid_objects, documents

EXAMPLES = ROOT / "examples" / "collector"
CONFIGS = ["sidecar.yaml", "node-agent.yaml"]


def _config(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


@pytest.mark.parametrize("name", CONFIGS)
def test_pipelines_reference_only_defined_components(name):
    config = _config(name)
    service = config["service"]
    for extension in service.get("extensions", []):
        assert extension in config.get("extensions", {}), extension
    assert service["pipelines"]
    for pipeline, spec in service["pipelines"].items():
        assert spec["receivers"] and spec["exporters"], pipeline
        for kind in ("receivers", "processors", "exporters"):
            for component in spec.get(kind, []):
                assert component in config.get(kind, {}), (pipeline, kind, component)
        processors = spec.get("processors", [])
        if "memory_limiter" in processors:
            assert processors[0] == "memory_limiter", "memory_limiter must come first"
        if "batch" in processors:
            assert processors[-1] == "batch", "batch must come last"
    used = {c for spec in service["pipelines"].values()
            for kind in ("receivers", "processors", "exporters") for c in spec.get(kind, [])}
    for kind in ("receivers", "processors", "exporters"):
        assert set(config.get(kind, {})) <= used, f"{kind} defined but never used"


def test_node_agent_says_it_needs_contrib_and_filters_its_node():
    text = (EXAMPLES / "node-agent.yaml").read_text()
    assert "contrib" in text
    processor = _config("node-agent.yaml")["processors"]["k8sattributes"]
    assert processor["filter"]["node_from_env_var"] == "K8S_NODE_NAME"


def _objects() -> dict[str, dict]:
    return {o["kind"]: o for o in documents((EXAMPLES / "node-agent-k8s.yaml").read_text())}


def test_node_agent_objects_validate():
    objects = documents((EXAMPLES / "node-agent-k8s.yaml").read_text())
    assert {o["kind"] for o in objects} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"}
    assert_valid_objects(objects)


def test_cluster_role_grants_what_k8sattributes_reads():
    granted = set()
    for rule in _objects()["ClusterRole"]["rules"]:
        assert set(rule["verbs"]) == {"get", "watch", "list"}, rule
        for group in rule["apiGroups"]:
            granted |= {(group, r) for r in rule["resources"]}
    assert granted == {("", "pods"), ("", "namespaces"), ("apps", "replicasets")}
    objects = _objects()
    binding = objects["ClusterRoleBinding"]
    account = objects["ServiceAccount"]["metadata"]
    assert binding["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                    "namespace": account["namespace"]}]
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["name"]


def test_daemonset_sets_the_node_variable_and_opens_the_receiver_ports():
    (container,) = _objects()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert "contrib" in container["image"]
    env = {e["name"]: e for e in container["env"]}
    assert env["K8S_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    ports = {p["containerPort"]: p for p in container["ports"]}
    protocols = _config("node-agent.yaml")["receivers"]["otlp"]["protocols"]
    for spec in protocols.values():
        port = int(spec["endpoint"].rsplit(":", 1)[1])
        assert ports[port]["hostPort"] == port
    health = _config("node-agent.yaml")["extensions"]["health_check"]["endpoint"]
    assert int(health.rsplit(":", 1)[1]) in ports
