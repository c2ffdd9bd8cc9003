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
    for needed in ("Fleet", "GPUs", "MIG instances", "Pods and namespaces",
                   "GPU time per workload", "Health", "NUMA alignment", "Collector"):
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
                   "otel_gpu_sample_age_seconds", 'hw_id=~"MIG-.*"',
                   *(f"nvidia_gpu_{kind}_{family}" for kind in ("k8s", "container", "hpc")
                     for family in ("time_allocated_seconds_total", "time_active_seconds_total",
                                    "idle_duration_seconds")),
                   "nvidia_gpu_time_unallocated_seconds_total", "nvidia_gpu_outside_use",
                   "nvidia_gpu_time_outside_seconds_total"):
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


def _expr(title: str, ref: str = "A") -> str:
    (expr,) = [e for t, e in QUERIES if t == f"{title} [{ref}]"]
    return grafana_to_promql(expr)


def test_the_idle_allocations_panel_names_the_pod_that_runs_nothing(node_stack):
    """The stack's notebook pod holds GPU 2 and runs nothing there; every other pod works."""
    result = node_stack.prometheus.wait_for_query(
        _expr("Idle allocations now"),
        lambda r: any(labels.get("k8s_pod_name") == "notebook" for labels, _ in r), timeout=40)
    assert {labels["k8s_pod_name"] for labels, _ in result} == {"notebook"}, result
    assert all(value > 0 for _, value in result)


def test_allocated_against_active_is_per_namespace_and_active_never_more(node_stack):
    title = "GPU-hours allocated and active in the time range"
    namespaces = {"ml", "serve", "research"}
    allocated = node_stack.prometheus.wait_for_query(
        _expr(title, "A"),
        lambda r: {lab.get("k8s_namespace_name") for lab, _ in r} >= namespaces, timeout=40)
    held = {lab["k8s_namespace_name"]: v for lab, v in allocated}
    result = node_stack.wait_for_data(_expr(title, "B"))
    active = {lab["k8s_namespace_name"]: v for lab, v in result}
    assert set(held) == namespaces, held
    assert all(0 <= active.get(ns, 0.0) <= held[ns] + 1e-9 for ns in held), (held, active)


def test_use_outside_any_allocation_names_the_free_gpu_with_a_process(node_stack):
    """GPU 5 is held by no pod and runs a process: a device used outside any allocation."""
    result = node_stack.wait_for_data(_expr("Used outside any allocation now"))
    assert {labels["nvidia_gpu_outside_kind"] for labels, _ in result} == {"unallocated_device"}
