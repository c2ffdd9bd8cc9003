"""The kustomize base and overlay: rendered with `kubectl kustomize`, validated, and the
same objects and hardening as the Helm chart's defaults."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.helpers import (
    CHART,
    DEPLOY,
    GPU_NODE_TERMS,
    RULES,
    assert_valid_objects,
    documents,
    helm_binary,
    run,
    tool,
)

KUSTOMIZE = DEPLOY / "kustomize"


def _build(path) -> list[dict]:
    kubectl = tool("kubectl", "any kubectl since 1.14 has kustomize built in")
    return documents(run(kubectl, "kustomize", str(path)))


def _by_kind(objects: list[dict]) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in objects}


def _pod(objects):
    return _by_kind(objects)["DaemonSet"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("target", ["base", "overlays/example"])
def test_kustomize_output_validates(target):
    assert_valid_objects(_build(KUSTOMIZE / target))


def test_base_matches_the_charts_defaults(tmp_path):
    base = _build(KUSTOMIZE / "base")
    chart = documents(run(helm_binary(), "template", "otel-gpu", str(CHART),
                          "--namespace", "monitoring",
                          "--set", "image.repository=registry.example.com/otel-gpu"))
    # the chart leaves the namespace to `helm install --create-namespace`
    assert sorted(_by_kind(base)) == sorted([*_by_kind(chart), "Namespace"])
    ours, theirs = _pod(base), _pod(chart)
    for key in ("securityContext", "tolerations", "priorityClassName",
                "automountServiceAccountToken", "affinity"):
        assert ours[key] == theirs[key], key
    assert "hostPID" not in ours
    (c1,), (c2,) = ours["containers"], theirs["containers"]
    for key in ("securityContext", "resources", "args", "env"):
        assert c1[key] == c2[key], key
    assert {(m["mountPath"], m["readOnly"]) for m in c1["volumeMounts"]} == {
        (m["mountPath"], m["readOnly"]) for m in c2["volumeMounts"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c1[probe]["httpGet"]["path"] == c2[probe]["httpGet"]["path"] == "/healthz"
    config = lambda objs: yaml.safe_load(_by_kind(objs)["ConfigMap"]["data"]["otel-gpu.yaml"])  # noqa: E731
    assert config(base) == config(chart)
    assert _by_kind(base)["Service"]["spec"]["publishNotReadyAddresses"] is True
    assert _by_kind(base)["ServiceAccount"]["automountServiceAccountToken"] is False


def test_overlay_turns_on_process_usage_with_its_mounts():
    objects = _build(KUSTOMIZE / "overlays" / "example")
    pod = _pod(objects)
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/var/log/pods", "/var/log/containers", "/var/lib/kubelet/pod-resources"} <= mounts
    config = yaml.safe_load(_by_kind(objects)["ConfigMap"]["data"]["otel-gpu.yaml"])
    assert config["process_usage"] is True
    assert pod["containers"][0]["image"] == "registry.example.com/otel-gpu:0.1.0"
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
        "gpu-monitoring"}


def test_overlay_rules_are_the_rules_file():
    rule = yaml.safe_load((KUSTOMIZE / "overlays" / "example" / "prometheusrule.yaml").read_text())
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_base_ships_the_namespace_its_objects_go_in():
    objects = _build(KUSTOMIZE / "base")
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == "monitoring"
    assert objects[0] is namespace  # kustomize orders it first: applied before the rest
    assert {o["metadata"]["namespace"] for o in objects if o is not namespace} == {"monitoring"}


def test_overlay_renames_the_bases_namespace():
    objects = _build(KUSTOMIZE / "overlays" / "example")
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"] == [
        "gpu-monitoring"]


def test_base_and_overlay_run_on_gpu_nodes_only():
    """A required node affinity, its terms ORed: any one label of a GPU node will do."""
    for target in ("base", "overlays/example"):
        affinity = _pod(_build(KUSTOMIZE / target))["affinity"]
        required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert required == {"nodeSelectorTerms": GPU_NODE_TERMS}, target
