"""The OpenTelemetry Collector examples: configurations whose pipelines name only
defined components, Kubernetes objects that validate and grant what
k8sattributes needs, and otel-gpu's settings as each example writes them, pushing
through a real Collector (rotel, from PyPI) on the example's port and protocol."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sysconfig
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from testkit.otlp_receiver import OtlpReceiver, metric_names
from testkit.process import CollectorProcess, wait_until
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


# --- the examples' otel-gpu settings, pushed for real through a Collector -----------------

def _readme_env() -> dict[str, str]:
    """The node agent's otel-gpu env block in README.md, as Kubernetes would expand it."""
    text = (EXAMPLES / "README.md").read_text()
    blocks = [yaml.safe_load(_dedent(b)) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)
              if "NODE_IP" in b]
    assert len(blocks) == 1, blocks
    env = {e["name"]: e["value"] for e in blocks[0]["env"] if "value" in e}
    assert "status.hostIP" in str(blocks[0]["env"])
    return _expand(env, {"NODE_IP": "127.0.0.1"})


def _comment_env(name: str) -> dict[str, str]:
    """The `otel-gpu side (container env):` lines heading a Collector configuration."""
    lines = (EXAMPLES / name).read_text().splitlines()
    start = lines.index("# otel-gpu side (container env):")
    env = {}
    for line in lines[start + 1:]:
        match = re.fullmatch(r"#\s+(OTEL_\w+)=(\S+)", line)
        if not line.startswith("#") or not line.strip("# "):
            break
        if match:
            env[match[1]] = match[2]
    return _expand(env, {"NODE_IP": "127.0.0.1"})


def _dedent(block: str) -> str:
    indent = min(len(ln) - len(ln.lstrip()) for ln in block.splitlines() if ln.strip())
    return "\n".join(ln[indent:] for ln in block.splitlines())


def _expand(env: dict, given: dict) -> dict[str, str]:
    return {k: re.sub(r"\$\((\w+)\)", lambda m: given[m[1]], v) for k, v in env.items()}


ENVS = {"README.md": _readme_env, "node-agent.yaml": lambda: _comment_env("node-agent.yaml"),
        "sidecar.yaml": lambda: _comment_env("sidecar.yaml")}


def _receiver_ports(name: str) -> dict[str, int]:
    config = "sidecar.yaml" if name == "sidecar.yaml" else "node-agent.yaml"
    protocols = _config(config)["receivers"]["otlp"]["protocols"]
    return {kind: int(spec["endpoint"].rsplit(":", 1)[1]) for kind, spec in protocols.items()}


@pytest.mark.parametrize("name", sorted(ENVS))
def test_the_example_pushes_on_the_port_of_its_protocol(name):
    """otel-gpu's default protocol is http/protobuf: gRPC's port needs the protocol set."""
    env = ENVS[name]()
    port = int(urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"]).port)
    protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    ports = _receiver_ports(name)
    assert port == ports["grpc" if protocol == "grpc" else "http"], (name, env)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rotel() -> Path:
    spec = importlib.util.find_spec("rotel")
    if spec is None or spec.origin is None:
        pytest.skip("rotel not installed (pip install -e '.[test]')")
    return Path(spec.origin).parent / "rotel-agent"


def _rotel_env() -> dict[str, str]:
    """rotel-agent links against this Python's libpython: where the interpreter's own
    library directory is not on the loader's path (a Python built into a prefix of its own),
    it is added."""
    env = dict(os.environ)
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (env.get("LD_LIBRARY_PATH", ""), libdir) if p)
    return env


@pytest.mark.parametrize("name", sorted(ENVS))
def test_the_example_as_written_reaches_a_real_collector(tmp_path, name):
    """otel-gpu with the example's settings pushes to rotel (a real OTLP Collector) on the
    example's port and protocol (moved to free ports), which forwards to a receiver."""
    env = ENVS[name]()
    ports = _receiver_ports(name)
    moved = {ports["grpc"]: _free_port(), ports["http"]: _free_port()}
    endpoint = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint._replace(
        netloc=f"{endpoint.hostname}:{moved[endpoint.port]}").geturl()
    with OtlpReceiver(http=False) as downstream:
        rotel = subprocess.Popen(
            [str(_rotel()), "start",
             "--otlp-grpc-endpoint", f"127.0.0.1:{moved[ports['grpc']]}",
             "--otlp-http-endpoint", f"127.0.0.1:{moved[ports['http']]}",
             "--exporter", "otlp", "--otlp-exporter-protocol", "grpc",
             "--otlp-exporter-endpoint", downstream.grpc_endpoint,
             "--batch-timeout", "100ms",
             "--pid-file", str(tmp_path / "rotel.pid"), "--log-file", str(tmp_path / "rotel.log")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_rotel_env())
        collector = CollectorProcess(
            ["serve", "--simulate", "t4", "--listen", "127.0.0.1:0", "--interval", "0.5",
             "--otlp-interval", "1s"],
            env={k: v for k, v in env.items() if k != "OTEL_METRIC_EXPORT_INTERVAL"})
        try:
            wait_until(lambda: any("hw.gpu.utilization" in metric_names(r)
                                   for r in downstream.requests),
                       timeout=30, what=f"{name}'s metrics through rotel")
            assert "Failed to export" not in collector.log, collector.log
        finally:
            collector.stop()
            rotel.terminate()
            rotel.wait(10)
