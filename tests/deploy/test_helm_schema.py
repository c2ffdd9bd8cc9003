"""values.schema.json: `helm install`, `helm template` and `helm lint` refuse a bad value
by name, before any pod exits 2 on it.

Every value of values.yaml is in the schema; the otel-gpu settings (`config.*`, and
the values the chart turns into settings) are typed and bounded as otel_gpu/config/
reads them. That is checked by asking both: for each setting and a list of values,
a value the schema accepts must be one otel-gpu accepts, and a value otel-gpu
accepts must pass the schema unless it is a lenient spelling the schema refuses on
purpose (padding spaces, other letter cases, yes/no for booleans, an empty string
for "not set", where leaving the key out says it)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest
import yaml

from otel_gpu import config as settings
from otel_gpu._log import FORMATS
from tests.deploy import durations
from tests.deploy.helpers import CHART, ROOT, helm_binary

jsonschema = pytest.importorskip("jsonschema")

SCHEMA_PATH = CHART / "values.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


# No image is published: each command names one, so only the value under test can fail.
IMAGE = ("--set", "image.repository=registry.example.com/otel-gpu")


def _helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_binary(), *args, *IMAGE], capture_output=True, text=True,
                          timeout=120)


def _validator():
    return jsonschema.Draft7Validator(SCHEMA)


# --- bad values: refused, by name --------------------------------------------------------

BAD = [
    # (--set or --set-string, the value, what the message names)
    ("--set", "config.bogus_key=1", "config: Additional property bogus_key is not allowed"),
    ("--set", "otlp.endpoint=not-a-url", "otlp.endpoint:"),
    ("--set", "interval=0s", "interval:"),
    ("--set", "interval=2h", "interval:"),
    ("--set", "interval=0.0016m", "interval:"),  # 96ms
    ("--set", "interval=abc", "interval:"),
    ("--set", "config.kubelet_timeout=301s", "config.kubelet_timeout:"),
    ("--set", "config.kubelet_grace_period=25h", "config.kubelet_grace_period:"),
    ("--set", "config.otlp_interval=500ms", "config.otlp_interval:"),
    ("--set", "config.otlp_endpoint=ftp://collector:21", "config.otlp_endpoint:"),
    ("--set", "config.otlp_endpoint=http://collector:0", "config.otlp_endpoint:"),
    ("--set", "config.log_level=verbose", "config.log_level:"),
    ("--set", "config.listen=9400", "config.listen:"),
    ("--set-string", "config.process_usage=maybe", "config.process_usage:"),
    ("--set", "config.dcgm_devices=all", "config.dcgm_devices:"),
    ("--set", "logFormat=xml", "logFormat:"),
    ("--set", "naming={otel,datadog}", "naming.1:"),
    ("--set", "naming=", "naming:"),
    ("--set", "otlp.protocol=http", "otlp.protocol:"),
    ("--set", "port=0", "port:"),
    ("--set", "port=65536", "port:"),
    ("--set", "healthListen.port=-1", "healthListen.port:"),
    ("--set", "bogus=1", "(root): Additional property bogus is not allowed"),
    ("--set", "image.tagg=1.0", "image: Additional property tagg is not allowed"),
    ("--set", "readinessProbe.path=/metrics", "readinessProbe.path:"),
    ("--set", "livenessProbe.periodSeconds=0", "livenessProbe.periodSeconds:"),
    ("--set", "serviceMonitor.interval=30", "serviceMonitor.interval:"),
    ("--set", "podMonitor.scrapeTimeout=ten", "podMonitor.scrapeTimeout:"),
    ("--set", "serviceMonitor.endpoint.path=/other", "serviceMonitor.endpoint"),
    ("--set-string", "gpuNodeAffinity.enabled=yes", "gpuNodeAffinity.enabled:"),
    ("--set", "gpuNodeAffinity.extraNodeSelectorTerms[0].matchExpressions[0].operator=Is",
     "gpuNodeAffinity.extraNodeSelectorTerms.0.matchExpressions.0"),
    ("--set", "tolerations[0].operator=Equals", "tolerations.0.operator:"),
    ("--set", "webConfig.probeScheme=https", "webConfig.probeScheme:"),
    ("--set", "webConfig.config.tls_server_config.client_auth_type=Always",
     "webConfig.config.tls_server_config.client_auth_type:"),
    ("--set", "updateStrategy.type=Recreate", "updateStrategy.type:"),
    ("--set", "resources.limits.memory=lots", "resources.limits.memory:"),
]


@pytest.mark.parametrize("command", ["template", "lint"])
@pytest.mark.parametrize(("flag", "value", "named"), BAD, ids=[b[1] for b in BAD])
def test_helm_refuses_a_bad_value_naming_it(command, flag, value, named):
    proc = _helm(command, str(CHART), flag, value)
    assert proc.returncode != 0, f"helm {command} accepted {value}"
    out = proc.stdout + proc.stderr
    assert "don't meet the specifications of the schema" in out, out
    assert f"- {named}" in out, out


# --- good values: the defaults and every documented example ------------------------------

def _values_examples() -> list[tuple[str, object]]:
    """values.yaml's `e.g. X` comments: (the path of the key under the comment, X)."""
    examples, pending, path = [], [], []
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            match = re.search(r"e\.g\. (\{.*\}|\[.*\]|[^\s).,;]+)", stripped)
            if match:
                pending.append(yaml.safe_load(match[1]))
            continue
        key = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not key:
            continue
        depth = len(key[1]) // 2
        path = path[:depth] + [key[2]]
        examples += [(".".join(path), value) for value in pending]
        pending = []
    return examples


def _nested(path: str, value) -> dict:
    for key in reversed(path.split(".")):
        value = {key: value}
    return value


def _markdown(path) -> str:
    return (ROOT / path).read_text()


def _documented_sets() -> list[str]:
    """`--set a=b` in the docs' helm commands, and `a.b=c` code spans of the chart's README."""
    found = []
    for doc in ("README.md", "docs/kubernetes.md", "deploy/helm/otel-gpu/README.md"):
        text = _markdown(doc)
        for command in re.findall(r"helm (?:install|upgrade|template)(?:[^\n\\]|\\\n)*", text):
            words = shlex.split(command.replace("\\\n", " "))
            found += [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    readme = _markdown("deploy/helm/otel-gpu/README.md")
    found += re.findall(r"`([a-zA-Z][\w]*(?:\.[\w]+)+=[^`\s]+)`", readme)
    return found


def _documented_values_files() -> list[dict]:
    readme = _markdown("deploy/helm/otel-gpu/README.md")
    blocks = re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)
    return [yaml.safe_load(_dedent(block)) for block in blocks]


def _dedent(block: str) -> str:
    lines = block.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def test_the_documented_examples_are_found():
    sets = _documented_sets()
    assert "image.repository=registry.example.com/otel-gpu" in sets
    assert {"gpuNodeAffinity.enabled=false", "readinessProbe.path=/readyz",
            "healthListen.port=9401", "webConfig.probeScheme=HTTPS"} <= set(sets)
    paths = {path for path, _ in _values_examples()}
    assert {"config", "runtimeClassName", "nodeSelector",
            "gpuNodeAffinity.extraNodeSelectorTerms"} <= paths
    assert any("gpuNodeAffinity" in doc for doc in _documented_values_files())


def test_the_defaults_pass_template_and_lint():
    for args in (("template", "gpu", str(CHART)), ("lint", "--strict", str(CHART))):
        proc = _helm(*args)
        assert proc.returncode == 0, proc.stderr
    assert not list(_validator().iter_errors(VALUES))


@pytest.mark.parametrize("value", _documented_sets())
def test_a_documented_set_passes(value):
    proc = _helm("template", "gpu", str(CHART), "--set", value)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("example", _values_examples(), ids=lambda e: str(e))
def test_a_values_yaml_example_passes(tmp_path, example):
    path, value = example
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(_nested(path, value)))
    proc = _helm("template", "gpu", str(CHART), "-f", str(values))
    assert proc.returncode == 0, proc.stderr


def test_the_readmes_values_files_pass(tmp_path):
    for i, doc in enumerate(_documented_values_files()):
        values = tmp_path / f"values-{i}.yaml"
        values.write_text(yaml.safe_dump(doc))
        proc = _helm("template", "gpu", str(CHART), "-f", str(values))
        assert proc.returncode == 0, f"{doc}: {proc.stderr}"


# Helm matches patterns with Go's regexp, the tests below with Python's: the same
# boundary values through Helm.
GOOD_DURATIONS = ["interval=100ms", "interval=0.0017m", "interval=1h", "interval=3600",
                  "interval=0.1", "interval=60m", "config.kubelet_grace_period=24h",
                  "config.kubelet_timeout=5m", "config.otlp_interval=1s",
                  "config.otlp_timeout=300000ms", "interval=10 s"]


@pytest.mark.parametrize("value", GOOD_DURATIONS)
def test_helm_accepts_durations_at_the_bounds(value):
    proc = _helm("template", "gpu", str(CHART), "--set", value)
    assert proc.returncode == 0, proc.stderr


# --- the schema covers every value, and only the chart's keys ----------------------------

def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].removeprefix("#/definitions/")]
    return node


def _uncovered(value, node: dict, path: str) -> list[str]:
    node = _resolve(node)
    if isinstance(value, dict):
        if "properties" in node:
            missing = [f"{path}{k}" for k in value if k not in node["properties"]]
            return missing + [m for k, v in value.items() if k in node["properties"]
                              for m in _uncovered(v, node["properties"][k], f"{path}{k}.")]
        if isinstance(node.get("additionalProperties"), dict):  # a map: its entries
            return [m for k, v in value.items()
                    for m in _uncovered(v, node["additionalProperties"], f"{path}{k}.")]
        return [] if node.get("type") == "object" else [path.rstrip(".")]
    if isinstance(value, list):
        items = node.get("items")
        if items is None:
            return [path.rstrip(".")]
        return [m for i, v in enumerate(value) for m in _uncovered(v, items, f"{path}{i}.")]
    return [] if node else [path.rstrip(".")]


def test_every_value_in_values_yaml_is_in_the_schema():
    assert _uncovered(VALUES, SCHEMA, "") == []
    # and the walk can fail: a value the schema lacks is reported
    assert _uncovered({**VALUES, "newValue": 1, "image": {**VALUES["image"], "digest": ""}},
                      SCHEMA, "") == ["newValue", "image.digest"]


def _objects(node, path="(root)"):
    if isinstance(node, dict):
        if "properties" in node:
            yield path, node
        for key, child in node.items():
            yield from _objects(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _objects(child, f"{path}/{i}")


def test_every_object_with_known_keys_refuses_others():
    open_ = [path for path, node in _objects(SCHEMA)
             if node.get("additionalProperties") is not False]
    assert open_ == []


def test_config_lists_every_otel_gpu_setting():
    assert set(SCHEMA["properties"]["config"]["properties"]) == {o.key for o in settings.OPTIONS}


def test_the_duration_patterns_are_otel_gpus_ranges():
    """The ranges of otel_gpu/config/settings.py as patterns (tests/deploy/durations.py)."""
    assert {k: v for k, v in SCHEMA["definitions"].items() if k.startswith("duration_")} == (
        durations.definitions()), "python -m tests.deploy.durations rewrites them"
    refs = {key: node.get("$ref") for key, node in SCHEMA["properties"]["config"]["properties"]
            .items()}
    for option in settings.OPTIONS:
        parse = getattr(settings, option.key.upper(), None)
        if hasattr(parse, "span"):
            span = parse.span.replace(" to ", "_")
            assert refs[option.key] == f"#/definitions/duration_{span}", option.key


def test_the_charts_own_settings_are_typed_as_otel_gpus():
    props, config = SCHEMA["properties"], SCHEMA["properties"]["config"]["properties"]
    assert props["interval"] == config["interval"]
    assert props["naming"] == config["naming"]
    assert props["otlp"]["properties"]["endpoint"] == config["otlp_endpoint"]
    assert props["otlp"]["properties"]["protocol"]["enum"] == config["otlp_protocol"]["enum"]
    assert props["logFormat"]["enum"] == list(FORMATS)


# --- the schema and otel-gpu agree on each setting ---------------------------------------

SAMPLES = [
    True, False, 0, 1, 5, 10, 0.05, 0.1, 0.5, 300, 301, 3600, 3601, 86400, 86401, -1, -0.5,
    "", " ", "10s", "0s", "0", "100ms", "99ms", "99.9ms", "100.0ms", "0.1", "0.09", "1h", "1.5h",
    "61m", "60m", "5m", "5.5m", "300s", "301s", "24h", "25h", "1440m", "1441m", "0.0017m",
    "0.0016m", "0.00003h", "0.00002h", "1s", "999ms", "abc", "10 s", " 10s ", "10S", "1d",
    "-5s", "1e3", "otel", "dcgm", "kubelet", "otel,dcgm", "otel, dcgm", "datadog",
    "otel,datadog", "otel,", ["otel"], ["otel", "dcgm"], [], ["datadog"], [" otel"],
    "prometheus", "otlp", "prometheus,otlp", ["prometheus", "otlp"], "zipkin",
    "http://collector:4318", "https://collector:4318/v1/metrics", "HTTP://collector:4318",
    "collector:4317", "[::1]:4317", "http://[::1]:4318", "not-a-url", "ftp://collector:21",
    "http://collector:0", "http://:4318", "http://collector", "http://collector:99999",
    "http://collector:4318 /x", "0.0.0.0:9400", ":9400", "[::]:9400", "127.0.0.1:65535",
    "127.0.0.1:65536", "9400", "host:port", "[zz]:9400", "gpu-node_1.example:80", "text",
    "json", "JSON", "xml", "debug", "info", "INFO", "warning", "error", "verbose", "identity",
    "all", "Hostname", "hostname", "HOSTNAME", "auto", "gpus", "instances", "both", "current",
    "old", "resource", "attributes", "grpc", "http/protobuf", "http", "gzip", "none",
    "cumulative", "delta", "yes", "no", "on", "true", "/var/lib/kubelet/pod-resources/kubelet.sock",
    "/host", "a\x01b", "nvidia.com/gpu", ["nvidia.com/gpu", "example.com/gpu"], ["a", ""],
    "nvidia.com/gpu,example.com/gpu", {"a": 1}, [1, 2], [["otel"]],
]
# What some settings need beside them to be valid at all.
CONTEXT = {"collectors": {"naming": "otel,dcgm"}}


def _otel_gpu_accepts(key: str, value) -> bool:
    try:
        settings.load(flags={**CONTEXT.get(key, {}), key: value}, environ={})
    except settings.ConfigError:
        return False
    return True


def _lenient(option: settings.Option, value) -> bool:
    """A spelling otel-gpu reads that the schema refuses on purpose."""
    if option.parse is settings.parse_bool or option.key == "otlp_insecure":
        return not isinstance(value, bool)
    if isinstance(value, str):
        return (value != value.strip() or value == "" or value != value.lower()
                or ", " in value or value.endswith(","))
    if isinstance(value, list):
        return any(_lenient(option, item) for item in value if isinstance(item, str))
    return False


@pytest.mark.parametrize("option", settings.OPTIONS, ids=lambda o: o.key)
def test_the_schema_and_otel_gpu_agree_on_each_setting(option):
    validator = _validator()
    wrong = []
    for value in SAMPLES:
        values = {"config": {**CONTEXT.get(option.key, {}), option.key: value}}
        schema_ok = validator.is_valid(values)
        otel_gpu_ok = _otel_gpu_accepts(option.key, value)
        if schema_ok and not otel_gpu_ok:
            wrong.append(f"{value!r}: the schema accepts it, otel-gpu does not")
        elif otel_gpu_ok and not schema_ok and not _lenient(option, value):
            wrong.append(f"{value!r}: otel-gpu accepts it, the schema does not")
    assert wrong == [], f"{option.key}: {wrong}"
