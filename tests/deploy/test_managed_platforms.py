"""Placement on managed Kubernetes (GKE, EKS, AKS) and the Prometheus Operator's selection,
by rendering: the chart, the kustomize base and overlays, and the example DaemonSet land
on each platform's GPU nodes, get admitted there, and are found by kube-prometheus-stack."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.deploy.helpers import (
    CHART,
    DEPLOY,
    ROOT,
    assert_valid_objects,
    chart_with_notes,
    documents,
    helm_binary,
    run,
    tool,
)

IMAGE = "image.repository=registry.example.com/otel-gpu"
OPERATOR_API = "monitoring.coreos.com/v1"
CRITICAL = ("system-node-critical", "system-cluster-critical")

# A GPU node of each platform as it comes: (its labels, its taints). The labels and taints
# are the ones the platform sets itself, or documents setting (EKS node groups, AKS).
NODES = {
    "gke": ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
            [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
    "eks-node-group": ({"k8s.amazonaws.com/accelerator": "nvidia-tesla-a10g"},
                       [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]),
    "eks-karpenter": ({"karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia"},
                      [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]),
    "eks-auto-mode": ({"eks.amazonaws.com/instance-gpu-manufacturer": "nvidia"},
                      [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
    "aks": ({"kubernetes.azure.com/accelerator": "nvidia"},
            [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]),
}
CPU_NODE = ({"kubernetes.io/os": "linux"}, [])


def _helm(tmp_path, values: dict, *extra: str) -> list[dict]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return documents(run(helm_binary(), "template", "gpu", str(CHART), "--namespace",
                         "monitoring", "--set", IMAGE, "-f", str(path), *extra))


def _kustomize(target: str) -> list[dict]:
    kubectl = tool("kubectl", "any kubectl since 1.14 has kustomize built in")
    return documents(run(kubectl, "kustomize", str(DEPLOY / "kustomize" / target)))


def _example() -> list[dict]:
    return documents((ROOT / "examples" / "kubernetes" / "daemonset.yaml").read_text())


def _by_kind(objects: list[dict]) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in objects}


def _pod(objects: list[dict]) -> dict:
    return _by_kind(objects)["DaemonSet"]["spec"]["template"]["spec"]


def _matches(term: dict, labels: dict) -> bool:
    for expr in term.get("matchExpressions", []):
        value = labels.get(expr["key"])
        op = expr["operator"]
        if op == "Exists" and value is None or op == "DoesNotExist" and value is not None:
            return False
        if op == "In" and value not in expr["values"]:
            return False
        if op == "NotIn" and value in expr["values"]:
            return False
    return True


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    return any(
        t.get("key") in (None, taint["key"])
        and t.get("effect") in (None, "", taint["effect"])
        and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
        for t in tolerations)


def _schedulable(pod: dict, node: tuple[dict, list[dict]]) -> bool:
    """Whether the scheduler would place the pod on the node (as kube-scheduler filters by
    node affinity, node selector and NoSchedule taints)."""
    labels, taints = node
    if any(labels.get(k) != v for k, v in pod.get("nodeSelector", {}).items()):
        return False
    required = (pod.get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required and not any(_matches(t, labels) for t in required["nodeSelectorTerms"]):
        return False
    return all(_tolerates(pod.get("tolerations", []), t) for t in taints)


def test_the_matcher_can_refuse():
    pod = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}]}}},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    assert _schedulable(pod, ({"a": "1"}, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]))
    assert not _schedulable(pod, ({"b": "1"}, []))
    assert not _schedulable(pod, ({"a": "1"}, [{"key": "sku", "value": "gpu",
                                                "effect": "NoSchedule"}]))


SOURCES = ["chart", "kustomize-base", "example"]


def _objects(source: str, tmp_path) -> list[dict]:
    if source == "chart":
        return _helm(tmp_path, {})
    if source == "kustomize-base":
        return _kustomize("base")
    return _example()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("platform", sorted(NODES))
def test_each_platforms_gpu_nodes_take_the_pod(tmp_path, source, platform):
    assert _schedulable(_pod(_objects(source, tmp_path)), NODES[platform])


@pytest.mark.parametrize("source", SOURCES)
def test_a_cpu_node_does_not(tmp_path, source):
    assert not _schedulable(_pod(_objects(source, tmp_path)), CPU_NODE)


@pytest.mark.parametrize("source", SOURCES)
def test_the_critical_priority_class_comes_with_the_quota_gke_admits_it_by(tmp_path, source):
    """GKE admits system-node-critical pods only in a namespace whose ResourceQuota selects
    that class; the quota must count nothing else."""
    objects = _objects(source, tmp_path)
    assert_valid_objects(objects)
    pod = _pod(objects)
    assert pod["priorityClassName"] in CRITICAL
    (quota,) = [o for o in objects if o["kind"] == "ResourceQuota"]
    daemonset = _by_kind(objects)["DaemonSet"]
    assert quota["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    assert quota["spec"]["scopeSelector"] == {"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": [pod["priorityClassName"]]}]}
    assert set(quota["spec"]["hard"]) == {"pods"}
    assert quota["spec"]["hard"]["pods"] == "1G"


@pytest.mark.parametrize(("values", "quota_for"), [
    ({"priorityClassName": "system-cluster-critical"}, "system-cluster-critical"),
    ({"priorityClassName": ""}, None),
    ({"priorityClassName": "gpu-agents"}, None),
    ({"priorityClassQuota": {"create": False}}, None),
], ids=["cluster-critical", "no-class", "own-class", "quota-off"])
def test_the_quota_follows_the_priority_class(tmp_path, values, quota_for):
    objects = _helm(tmp_path, values)
    quotas = [o for o in objects if o["kind"] == "ResourceQuota"]
    if quota_for is None:
        assert quotas == []
    else:
        (quota,) = quotas
        assert quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == [quota_for]


def _host_driver_checks(objects: list[dict]) -> None:
    pod = _pod(objects)
    (container,) = pod["containers"]
    assert {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"} in container["env"]
    context = container["securityContext"]
    # the API server refuses privileged with allowPrivilegeEscalation false
    assert context["privileged"] is True and "allowPrivilegeEscalation" not in context
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["nvidia-driver"] == {"name": "nvidia-driver", "mountPath": "/usr/local/nvidia",
                                       "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["nvidia-driver"]["hostPath"] == {"path": "/home/kubernetes/bin/nvidia",
                                                   "type": "Directory"}


def test_gkes_host_driver_in_the_chart(tmp_path):
    objects = _helm(tmp_path, {"hostDriver": {"enabled": True}})
    assert_valid_objects(objects)
    _host_driver_checks(objects)
    # off by default: the NVIDIA container runtime brings NVML and the devices
    (container,) = _pod(_helm(tmp_path, {}))["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "privileged" not in container["securityContext"]
    assert not {m["mountPath"] for m in container["volumeMounts"]} & {"/usr/local/nvidia"}


def test_gkes_host_driver_in_the_kustomize_overlay(tmp_path):
    objects = _kustomize("overlays/gke")
    assert_valid_objects(objects)
    _host_driver_checks(objects)
    assert "ResourceQuota" in _by_kind(objects)
    assert _pod(objects)["containers"][0]["image"] == "registry.example.com/otel-gpu:0.1.0"
    chart = _pod(_helm(tmp_path, {"hostDriver": {"enabled": True}}))["containers"][0]
    assert _pod(objects)["containers"][0]["securityContext"] == chart["securityContext"]


# --- the Prometheus Operator's selection ---------------------------------------------------

OPERATOR_OBJECTS = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                    "prometheusRule": {"enabled": True}}
MONITOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")


def test_monitor_labels_label_all_three(tmp_path):
    values = {**OPERATOR_OBJECTS, "monitorLabels": {"release": "kube-prometheus-stack"}}
    kinds = _by_kind(_helm(tmp_path, values))
    for kind in MONITOR_KINDS:
        assert kinds[kind]["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
        assert kinds[kind]["metadata"]["labels"]["app.kubernetes.io/name"] == "otel-gpu", kind
    # each object's own labels are added, and win
    values["prometheusRule"] = {"enabled": True, "labels": {"release": "rules", "team": "gpu"}}
    rule = _by_kind(_helm(tmp_path, values))["PrometheusRule"]["metadata"]["labels"]
    assert rule["release"] == "rules" and rule["team"] == "gpu"
    # and nothing else gets them
    for obj in _helm(tmp_path, values):
        if obj["kind"] not in MONITOR_KINDS:
            assert "release" not in obj["metadata"].get("labels", {}), obj["kind"]


def _notes(tmp_path, values: dict) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    objects = documents(run(helm_binary(), "template", "gpu", str(chart_with_notes(tmp_path)),
                            "--namespace", "monitoring", "--set", IMAGE, "-f", str(path),
                            "--api-versions", OPERATOR_API))
    (notes,) = [o for o in objects if o["metadata"]["name"] == "rendered-notes"]
    return notes["data"]["NOTES.txt"]


def test_the_notes_say_when_a_monitor_lacks_the_release_label(tmp_path):
    notes = _notes(tmp_path, {})
    assert "The ServiceMonitor has no `release` label" in notes
    assert "--set monitorLabels.release=RELEASE" in notes
    notes = _notes(tmp_path, {**OPERATOR_OBJECTS, "monitorLabels": {"release": "kps"}})
    assert "no `release` label" not in notes
    notes = _notes(tmp_path, {**OPERATOR_OBJECTS, "podMonitor": {"enabled": True,
                                                                "labels": {"release": "kps"}}})
    assert [line.split()[1] for line in notes.splitlines()
            if "no `release` label" in line] == ["ServiceMonitor", "PrometheusRule"]


def test_the_kustomize_overlays_monitors_carry_the_release_label():
    objects = _kustomize("overlays/example")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert _by_kind(objects)[kind]["metadata"]["labels"]["release"], kind


# --- the docs say what each platform needs --------------------------------------------------

DOC = (ROOT / "docs" / "kubernetes.md").read_text()


def _section(title: str) -> str:
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ |\Z)", DOC, flags=re.M | re.S)
    assert match, f"docs/kubernetes.md has no section {title!r}"
    return match[1]


@pytest.mark.parametrize(("platform", "nodes"), [
    ("GKE", ["gke"]), ("EKS", ["eks-node-group", "eks-karpenter", "eks-auto-mode"]),
    ("AKS", ["aks"])])
def test_the_docs_name_each_platforms_labels_taints_and_socket(platform, nodes):
    text = _section(platform)
    for node in nodes:
        labels, taints = NODES[node]
        assert all(key in text for key in labels), (platform, labels)
        assert all(t["key"] in text for t in taints), (platform, taints)
    assert "/var/lib/kubelet/pod-resources" in text, platform
    assert "priority" in text.lower(), platform


def test_the_docs_gke_values_render_what_gke_needs(tmp_path):
    blocks = re.findall(r"```yaml\n(.*?)```", _section("GKE"), flags=re.S)
    (values,) = [yaml.safe_load(b) for b in blocks if "hostDriver" in b]
    objects = _helm(tmp_path, values)
    assert_valid_objects(objects)
    _host_driver_checks(objects)
    assert "ResourceQuota" in _by_kind(objects)
    assert _schedulable(_pod(objects), NODES["gke"])


def test_the_docs_install_command_sets_the_release_label():
    commands = re.findall(r"helm install(?:[^\n\\]|\\\n)*", DOC)
    assert any("--set monitorLabels.release=" in c for c in commands), commands
