"""Helm's refusal of a value failing a pattern of values.schema.json says what the value
may be, in words, and prints no regular expression (tests/deploy/schema_text.py)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.deploy import durations, schema_text
from tests.deploy.helpers import CHART, helm_binary

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
IMAGE = ("--set", "image.repository=registry.example.com/otel-gpu")

# (--set or --set-string, the value, what Helm's line must say)
BAD = [
    ("--set", "interval=2h", "interval does not match: \"a duration from 100ms to 1h: seconds"),
    ("--set", "interval=abc", "(500ms, 10s, 5m, 1h)"),
    ("--set", "config.kubelet_timeout=301s", "a duration from 100ms to 5m"),
    ("--set", "otlp.endpoint=not-a-url", "an OTLP endpoint: http://HOST[:PORT][/PATH]"),
    ("--set", "config.listen=:99999", "an address HOST:PORT or :PORT"),
    ("--set-string", "naming=otel;dcgm", "otel, dcgm or kubelet, or several of them"),
    ("--set", "config.exporters=zipkin", "prometheus, otlp, or both"),
    ("--set", "resources.limits.memory=lots", "a Kubernetes quantity (64Mi, 1Gi, 20m, 0.5)"),
    ("--set", "serviceMonitor.interval=30 s", "a Prometheus duration (30s, 1m, 1m30s)"),
    ("--set", "serviceAccount.name=Bad_Name", "a Kubernetes object name: lower-case letters"),
    ("--set", "grafanaDashboard.namespace=a.b", "a namespace: lower-case letters, digits and -"),
    ("--set", "podAttribution.hostPath=var/lib", "an absolute path, starting with /"),
    ("--set", "image.repository=Registry/OTel", "an image name without its tag"),
    ("--set", "image.tag=-rc", "an image tag: letters, digits"),
    ("--set", "webConfig.scrape.caSecret.key=a/b", "a key of a Secret: letters, digits"),
    ("--set", "webConfig.config.basic_auth_users.prometheus=secret", "a bcrypt hash ($2y$10$"),
    ("--set", "updateStrategy.rollingUpdate.maxUnavailable=half",
     "a number of nodes, or a percentage of them (10%)"),
]


def _helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_binary(), "template", "gpu", str(CHART), *IMAGE, *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("flag", "value", "says"), BAD, ids=[b[1] for b in BAD])
def test_helm_says_what_a_patterned_value_may_be(flag, value, says):
    proc = _helm(flag, value)
    assert proc.returncode != 0, f"helm accepted {value}"
    out = proc.stdout + proc.stderr
    key = value.split("=", 1)[0]
    lines = [line for line in out.splitlines() if line.startswith(f"- {key}")]
    assert any(says in line for line in lines), out
    assert "pattern" not in out, out
    assert not re.search(r"\(\?:|\\s\*|\[0-9\]", out), out


def test_every_pattern_is_explained():
    """A pattern added bare would bring the regex back into Helm's message."""
    assert list(schema_text.unexplained(SCHEMA)) == [], (
        "python -m tests.deploy.schema_text rewrites them")
    # and the walk can fail
    assert list(schema_text.unexplained({"properties": {"a": {"pattern": "^x$"}}})) == [
        ("(root)/properties/a", "^x$")]


def _explained_nodes(node, path="(root)"):
    if isinstance(node, dict):
        if "if" in node and "else" in node:
            yield path, node
        for key, child in node.items():
            yield from _explained_nodes(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _explained_nodes(child, f"{path}/{i}")


def test_each_else_is_a_sentence_nothing_can_equal():
    nodes = list(_explained_nodes(SCHEMA))
    assert len(nodes) > 40
    for path, node in nodes:
        text = node["else"]["const"]
        assert node["else"]["not"] == {"const": text}, path
        assert text and not re.search(r"\(\?:|\\[sd]|\[\^", text), (path, text)
        assert node.get("description"), path
    # the sentence itself is refused: the form changes no value's verdict
    validator = jsonschema.Draft7Validator(SCHEMA)
    interval = SCHEMA["properties"]["interval"]
    sentence = SCHEMA["definitions"][interval["$ref"].split("/")[-1]]["else"]["const"]
    assert not validator.is_valid({"interval": sentence})
    assert validator.is_valid({"interval": "10s"})


def test_the_duration_definitions_are_explained():
    for name, node in durations.definitions().items():
        assert node["else"]["const"] == node["description"], name
        assert set(node["if"]) == {"pattern", "minimum", "maximum", "allOf"}, name
