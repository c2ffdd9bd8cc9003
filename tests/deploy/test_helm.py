"""The Helm chart: `helm lint`, and `helm template` over a matrix of values, every
object validated against the Kubernetes schemas and checked for what each value asks."""

from __future__ import annotations

import copy
import http.client
import json
import re
import subprocess
import sys

import pytest
import yaml

from testkit.process import CollectorProcess, http_get, wait_until
from tests.deploy.helpers import (
    CHART,
    DEPLOY,
    GPU_NODE_TERMS,
    assert_valid_objects,
    documents,
    helm_binary,
    run,
)
from tests.support.certs import make_certs

OPERATOR_API = "monitoring.coreos.com/v1"

CASES = {
    "defaults": {},
    "everything-off": {
        "podAttribution": {"enabled": False},
        "numa": {"enabled": False},
        "serviceMonitor": {"enabled": False},
    },
    "process-usage": {"processUsage": {"enabled": True}},
    "mtls-health-listener": {
        "webConfig": {
            "enabled": True,
            "tlsSecret": "otel-gpu-tls",
            "scrape": {"caSecret": {"name": "otel-gpu-tls"},
                       "clientCertSecret": {"name": "prometheus-client"}},
            "config": {"tls_server_config": {
                "cert_file": "/etc/otel-gpu/web/tls.crt", "key_file": "/etc/otel-gpu/web/tls.key",
                "client_auth_type": "RequireAndVerifyClientCert",
                "client_ca_file": "/etc/otel-gpu/web/ca.crt",
            }},
        },
        "healthListen": {"port": 9401},
    },
    "tls-existing-secret": {
        "webConfig": {"enabled": True, "existingSecret": "my-web", "probeScheme": "HTTPS",
                      "scrape": {"caSecret": {"name": "my-web"}}},
    },
    "operator-objects": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True, "namespace": "grafana"},
    },
    "otlp-and-naming": {
        "otlp": {"endpoint": "http://collector:4318", "protocol": "http/protobuf",
                 "headersSecret": {"name": "otlp-token"}},
        "naming": ["otel", "dcgm"],
        "config": {"kubelet_grace_period": "2m"},
    },
    "placement": {
        "runtimeClassName": "nvidia",
        "gpuNodeAffinity": {"extraNodeSelectorTerms": [
            {"matchExpressions": [{"key": "example.com/gpu", "operator": "Exists"}]}]},
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                              "labelSelector": {"matchLabels": {"a": "b"}}}}]}},
        "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        "priorityClassName": "",
        "serviceAccount": {"create": False, "name": "gpu-monitor"},
    },
}


# No image is published: every render names one (test_image.py: the refusal without it).
IMAGE = {"repository": "registry.example.com/otel-gpu"}


def _render(tmp_path, values: dict, *extra: str) -> list[dict]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"image": IMAGE, **values}))
    out = run(helm_binary(), "template", "gpu", str(CHART), "--namespace", "monitoring",
              "-f", str(path), *extra)
    return documents(out)


def _kinds(objects: list[dict]) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in objects}


def _pod(objects: list[dict]) -> dict:
    return _kinds(objects)["DaemonSet"]["spec"]["template"]["spec"]


def _config(objects: list[dict]) -> dict:
    return yaml.safe_load(_kinds(objects)["ConfigMap"]["data"]["otel-gpu.yaml"])


def test_helm_lint_passes():
    out = run(helm_binary(), "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("api", [False, True], ids=["plain-cluster", "with-operator"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_object_validates(tmp_path, case, api):
    extra = ("--api-versions", OPERATOR_API) if api else ()
    objects = _render(tmp_path, CASES[case], *extra)
    assert_valid_objects(objects)
    kinds = [obj["kind"] for obj in objects]
    assert len(kinds) == len(set(kinds)) or kinds.count("ConfigMap") == 2, kinds
    for obj in objects:
        if obj["kind"] in ("PodMonitor", "PrometheusRule"):
            assert case == "operator-objects", obj["kind"]


def test_defaults_are_hardened_and_mount_what_attribution_and_numa_need(tmp_path):
    objects = _render(tmp_path, {})
    kinds = _kinds(objects)
    assert set(kinds) == {"ServiceAccount", "ConfigMap", "Service", "DaemonSet", "ResourceQuota"}
    assert kinds["ServiceAccount"]["automountServiceAccountToken"] is False
    pod = _pod(objects)
    assert pod["automountServiceAccountToken"] is False
    assert "hostPID" not in pod
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    assert "nodeSelector" not in pod
    assert pod["affinity"] == {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": GPU_NODE_TERMS}}}
    assert pod["priorityClassName"] == "system-node-critical"
    (container,) = pod["containers"]
    ctx = container["securityContext"]
    assert ctx == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                   "capabilities": {"drop": ["ALL"]}}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {"/etc/otel-gpu/config", "/var/lib/kubelet/pod-resources",
                           "/host/sys"}
    assert all(m["readOnly"] for m in mounts.values())
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["limits"]["memory"] == "192Mi"
    config = _config(objects)
    assert config["pod_attribution"] is True and config["sysfs_root"] == "/host"
    assert config["process_usage"] is False
    service = kinds["Service"]["spec"]
    assert service["publishNotReadyAddresses"] is True


def test_features_off_need_no_host_access_and_run_as_nobody(tmp_path):
    objects = _render(tmp_path, CASES["everything-off"], "--api-versions", OPERATOR_API)
    pod = _pod(objects)
    assert [v["name"] for v in pod["volumes"]] == ["config"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65534
    assert "ServiceMonitor" not in _kinds(objects)
    config = _config(objects)
    assert config["pod_attribution"] is False and "sysfs_root" not in config


def test_service_monitor_follows_the_operator_api(tmp_path):
    assert "ServiceMonitor" not in _kinds(_render(tmp_path, {}))
    monitor = _kinds(_render(tmp_path, {}, "--api-versions", OPERATOR_API))["ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert "ServiceMonitor" in _kinds(_render(tmp_path, {"serviceMonitor": {"enabled": True}}))


def test_process_usage_brings_host_pid_and_log_directories(tmp_path):
    objects = _render(tmp_path, CASES["process-usage"])
    pod = _pod(objects)
    assert pod["hostPID"] is True
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {"/var/log/pods", "/var/log/containers"} <= paths
    assert _config(objects)["process_usage"] is True


def test_probes_use_the_plain_health_listener_under_mtls(tmp_path):
    objects = _render(tmp_path, CASES["mtls-health-listener"])
    (container,) = _pod(objects)["containers"]
    assert {"name": "health", "containerPort": 9401, "protocol": "TCP"} in container["ports"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "health"
        assert container[probe]["httpGet"]["scheme"] == "HTTP"
    config = _config(objects)
    assert config["health_listen"] == "0.0.0.0:9401"
    assert config["web_config_file"] == "/etc/otel-gpu/web/web-config.yml"
    secret = _kinds(objects)["Secret"]
    web = yaml.safe_load(secret["stringData"]["web-config.yml"])
    assert web["tls_server_config"]["client_auth_type"] == "RequireAndVerifyClientCert"


def test_an_existing_web_config_secret_is_mounted_not_written(tmp_path):
    objects = _render(tmp_path, CASES["tls-existing-secret"])
    assert "Secret" not in _kinds(objects)
    pod = _pod(objects)
    assert {"name": "web-config", "secret": {"secretName": "my-web"}} in pod["volumes"]
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_otlp_headers_come_from_a_secret_file(tmp_path):
    objects = _render(tmp_path, CASES["otlp-and-naming"])
    config = _config(objects)
    assert config["otlp_endpoint"] == "http://collector:4318"
    assert config["otlp_headers_file"] == "/etc/otel-gpu/otlp/otlp-headers"
    assert config["naming"] == ["otel", "dcgm"] and config["kubelet_grace_period"] == "2m"
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    assert volumes["otlp-headers"]["secret"]["secretName"] == "otlp-token"


def test_placement_values(tmp_path):
    pod = _pod(_render(tmp_path, CASES["placement"]))
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    # the extra term widens the GPU-node terms (ORed); podAntiAffinity is added beside them
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [
        *GPU_NODE_TERMS,
        {"matchExpressions": [{"key": "example.com/gpu", "operator": "Exists"}]}]
    assert pod["affinity"]["podAntiAffinity"] == (
        CASES["placement"]["affinity"]["podAntiAffinity"])
    assert "priorityClassName" not in pod
    assert pod["serviceAccountName"] == "gpu-monitor"


def test_gpu_node_affinity_is_replaced_by_a_node_affinity_or_switched_off(tmp_path):
    own = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}
    pod = _pod(_render(tmp_path, {"affinity": {"nodeAffinity": own}}))
    assert pod["affinity"] == {"nodeAffinity": own}
    pod = _pod(_render(tmp_path, {"gpuNodeAffinity": {"enabled": False}}))
    assert "affinity" not in pod and "nodeSelector" not in pod


def test_the_charts_copies_of_the_rules_and_dashboard_are_identical():
    files = CHART / "files"
    assert (files / "otel-gpu-rules.yaml").read_bytes() == (
        DEPLOY / "prometheus" / "otel-gpu-rules.yaml").read_bytes(), (
        "cp deploy/prometheus/otel-gpu-rules.yaml deploy/helm/otel-gpu/files/")
    assert (files / "otel-gpu.json").read_bytes() == (
        DEPLOY / "grafana" / "otel-gpu.json").read_bytes(), (
        "cp deploy/grafana/otel-gpu.json deploy/helm/otel-gpu/files/")


def test_the_chart_renders_the_rules_and_dashboard(tmp_path):
    kinds = _kinds(_render(tmp_path, CASES["operator-objects"]))
    rules = yaml.safe_load((DEPLOY / "prometheus" / "otel-gpu-rules.yaml").read_text())
    assert kinds["PrometheusRule"]["spec"] == rules
    dashboards = [o for o in _render(tmp_path, CASES["operator-objects"])
                  if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    (dashboard,) = dashboards
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "grafana"
    assert json.loads(dashboard["data"]["otel-gpu.json"])["panels"]


@pytest.mark.parametrize("case", ["defaults", "everything-off", "process-usage"])
def test_otel_gpu_accepts_the_rendered_configuration(tmp_path, case):
    config = _config(_render(tmp_path, CASES[case]))
    config.pop("sysfs_root", None)  # /host/sys is the pod's mount, not this machine's
    path = tmp_path / "otel-gpu.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "otel_gpu", "check", "--config", str(path),
         "--simulate", "t4"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_rendered_probes_pass_under_mutual_tls(tmp_path):
    """The chart's mTLS case run for real: otel-gpu with the rendered configuration
    and web config, probed as the kubelet would (plain HTTP, no certificate)."""
    values = copy.deepcopy(CASES["mtls-health-listener"])
    values["webConfig"]["config"]["tls_server_config"].update(
        cert_file="server.crt", key_file="server.key", client_ca_file="ca.crt")
    objects = _render(tmp_path, values)
    certs = make_certs(tmp_path / "web")
    for path, name in ((certs.server_cert, "server.crt"), (certs.server_key, "server.key"),
                       (certs.ca_cert, "ca.crt")):
        path.rename(tmp_path / "web" / name)
    web = tmp_path / "web" / "web-config.yml"
    web.write_text(_kinds(objects)["Secret"]["stringData"]["web-config.yml"])
    config = _config(objects)
    config.pop("sysfs_root")
    config.update(web_config_file=str(web), listen="127.0.0.1:0", health_listen="127.0.0.1:0",
                  kubelet_socket=str(tmp_path / "no-kubelet.sock"))
    (tmp_path / "otel-gpu.yaml").write_text(yaml.safe_dump(config))
    (container,) = _pod(objects)["containers"]
    probes = [container[p]["httpGet"] for p in ("readinessProbe", "livenessProbe")]
    assert {(p["port"], p["scheme"]) for p in probes} == {("health", "HTTP")}

    proc = CollectorProcess(["serve", "--config", str(tmp_path / "otel-gpu.yaml"),
                             "--simulate", "t4"])
    try:
        proc.wait_serving()
        health = re.compile(r"serving health checks on http://\S+:(\d+)/healthz")

        def health_port():
            found = [health.search(line) for line in proc.lines]
            return next((int(m.group(1)) for m in found if m), None)

        port = wait_until(health_port, what="the health listener's log line")
        for probe in probes:
            status, _, _ = http_get(f"http://127.0.0.1:{port}{probe['path']}")
            assert status == 200, probe
        # the same probe on the metrics port cannot pass the mTLS handshake
        with pytest.raises((OSError, http.client.HTTPException)):
            http_get(f"http://127.0.0.1:{proc.port}{probes[0]['path']}", timeout=5)
    finally:
        proc.stop()
