"""The Grafana dashboard: every panel query and template variable, run in a real
Prometheus scraping otel-gpu (GPUs whole, shared and MIG, pods, process usage), returns data."""

from __future__ import annotations

import json
import re

import pytest

from tests.deploy.helpers import DEPLOY
from tests.deploy.stack import grafana_to_promql

DASHBOARD = json.loads((DEPLOY / "grafana" / "otel-gpu.json").read_text())


def _panels(panels=None):
    for panel in DASHBOARD["panels"] if panels is None else panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _queries() -> list[tuple[str, str]]:
    return [(f"{panel['title']} [{target['refId']}]", target["expr"])
            for panel in _panels() for target in panel.get("targets", [])]


def _variables() -> dict[str, dict]:
    return {v["name"]: v for v in DASHBOARD["templating"]["list"]}


QUERIES = _queries()


def test_dashboard_is_well_formed():
    ids = [p["id"] for p in _panels()]
    assert len(ids) == len(set(ids))
    assert len(QUERIES) >= 40
    titles = {p["title"] for p in _panels() if p["type"] == "row"}
    for needed in ("Fleet", "GPUs", "MIG instances", "Pods and namespaces", "Health",
                   "NUMA alignment", "Collector"):
        assert needed in titles
    variables = _variables()
    for _, expr in QUERIES:
        for name in re.findall(r"\$\{?(\w+)", expr):
            assert name.startswith("__") or name in variables, (name, expr)
    for panel in _panels():
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    names = " ".join(expr for _, expr in QUERIES)
    for series in ("nvidia_gpu_sm_activity", "nvidia_gpu_k8s_memory_usage_bytes",
                   "nvidia_gpu_k8s_sm_utilization", "nvidia_gpu_xid_errors_total",
                   "nvidia_gpu_memory_remapped_rows_total", "nvidia_gpu_numa_alignment",
                   "otel_gpu_sample_age_seconds", 'hw_id=~"MIG-.*"'):
        assert series in names, series


def test_substitution_leaves_no_variable():
    assert grafana_to_promql('rate(x{a=~"$node", b=~"${pod}"}[$__rate_interval])') == (
        'rate(x{a=~".*", b=~".*"}[1m])')


@pytest.mark.parametrize(("title", "expr"), QUERIES, ids=[t for t, _ in QUERIES])
def test_every_panel_returns_data(node_stack, title, expr):
    result = node_stack.wait_for_data(grafana_to_promql(expr))
    assert all(isinstance(value, float) for _, value in result), (title, result)


@pytest.mark.parametrize("name", ["node", "gpu", "namespace", "pod"])
def test_every_template_variable_has_values(node_stack, name):
    query = _variables()[name]["query"]["query"]
    match = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
    assert match, query
    result = node_stack.wait_for_data(grafana_to_promql(match.group(1)))
    assert any(labels.get(match.group(2)) for labels, _ in result), query
