"""Every PromQL expression in the README, docs/ and examples/ (fenced ```promql
blocks) returns data from a real Prometheus scraping otel-gpu: on a Kubernetes
node with pods on whole, shared and MIG devices, a free GPU, and process usage
on; or, for the docs about hosts without a kubelet, on a Docker host whose
containers use GPUs alone and shared."""

from __future__ import annotations

import re

import pytest

from tests.deploy.helpers import ROOT

FENCE = re.compile(r"^```promql\n(.*?)^```", re.S | re.M)
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
           *sorted((ROOT / "examples").rglob("*.md"))]


def expressions(text: str) -> list[str]:
    """The expressions of the promql blocks: separated by blank or comment lines."""
    found = []
    for block in FENCE.findall(text):
        current: list[str] = []
        for line in [*block.splitlines(), ""]:
            if line.strip() and not line.lstrip().startswith("#"):
                current.append(line)
            elif current:
                found.append("\n".join(current))
                current = []
    return found


def _all() -> list[tuple[str, str]]:
    out = []
    for path in SOURCES:
        for i, expr in enumerate(expressions(path.read_text())):
            out.append((f"{path.relative_to(ROOT)}#{i}", expr))
    return out


QUERIES = _all()

# The docs whose queries are about another kind of host than a Kubernetes node,
# and the stack fixture that is one; every other doc runs on `node_stack`.
STACKS = {"docs/containers.md": "docker_stack"}


def stack_for(where: str) -> str:
    return STACKS.get(where.split("#")[0], "node_stack")


def test_expressions_are_split_at_blank_and_comment_lines():
    text = "```promql\n# a\nfoo\n* on (x)\n  bar\n\n# b\nbaz\n```\n```sh\nnot_promql\n```\n"
    assert expressions(text) == ["foo\n* on (x)\n  bar", "baz"]


def test_the_docs_have_queries_in_promql_blocks():
    where = {name.split("#")[0] for name, _ in QUERIES}
    assert {"README.md", "docs/kubernetes.md"} <= where
    assert len(QUERIES) >= 10
    # the fixed ones: pods counted once, MIG pods joined, the task regex
    joined = "\n".join(expr for _, expr in QUERIES)
    pods_per_gpu = "count by (hw_id, k8s_namespace_name, k8s_pod_name) (nvidia_gpu_k8s_allocation)"
    assert pods_per_gpu in joined
    assert 'hw_gpu_task=~"general|encoder|decoder"' in joined
    assert "nvidia_gpu_sm_activity\n* on (hw_id) group_right" in joined


def test_every_doc_given_another_stack_has_queries():
    where = {name.split("#")[0] for name, _ in QUERIES}
    assert set(STACKS) <= where


@pytest.mark.parametrize(("where", "expr"), QUERIES, ids=[w for w, _ in QUERIES])
def test_every_documented_query_returns_data(request, where, expr):
    result = request.getfixturevalue(stack_for(where)).wait_for_data(expr)
    assert all(isinstance(value, float) for _, value in result), (where, expr, result)


def test_pods_per_gpu_counts_pods_not_replicas(node_stack):
    (expr,) = [e for _, e in QUERIES if "count by (hw_id, k8s_namespace_name" in e]
    result = node_stack.wait_for_data(expr)
    counts = sorted(value for _, value in result)
    # GPU 1 is shared by two pods over three replicas; the others have one holder
    assert max(counts) == 2, result


def test_the_activity_join_includes_mig_pods(node_stack):
    (expr,) = [e for _, e in QUERIES if e.startswith("  nvidia_gpu_sm_activity")]
    pods = {labels["k8s_pod_name"] for labels, _ in node_stack.wait_for_data(expr)}
    assert {"mig-big", "mig-small", "api-a", "api-b", "train-0"} <= pods


def test_memory_per_container_sums_each_containers_processes(docker_stack):
    from tests.deploy.docker_stack import MEMORY

    (expr,) = [e for w, e in QUERIES
               if stack_for(w) == "docker_stack" and "nvidia_gpu_container_memory_usage_bytes" in e]
    # every container is named once the runtime's first answer is in
    result = docker_stack.prometheus.wait_for_query(
        expr, lambda r: {labels.get("container_name") for labels, _ in r} == set(MEMORY),
        timeout=40)
    assert {labels["container_name"]: value for labels, value in result} == MEMORY


def test_utilization_per_container_is_of_the_gpu_used_alone(docker_stack):
    from tests.deploy.docker_stack import ALONE

    (expr,) = [e for w, e in QUERIES
               if stack_for(w) == "docker_stack" and "hw_gpu_utilization" in e]
    result = docker_stack.wait_for_data(expr)
    # the shared GPU names no container on its own series
    assert [(labels["hw_id"], labels["container_name"]) for labels, _ in result] == [
        (ALONE, "trainer")]


def test_the_showback_by_team_joins_every_pods_team(node_stack):
    """The team query sums each team's pods, as kube-state-metrics labels them; by namespace
    and by team, the same GPU-hours."""
    from tests.deploy.kube_state import TEAMS

    (expr,) = [e for _, e in QUERIES if "kube_pod_labels" in e]
    result = node_stack.prometheus.wait_for_query(
        expr, lambda r: {labels.get("label_team") for labels, _ in r} == set(TEAMS.values()),
        timeout=40)
    assert all(value > 0 for _, value in result), result
    (by_namespace,) = [e for _, e in QUERIES if e.startswith(
        "sum by (k8s_namespace_name) (increase(nvidia_gpu_k8s_time_allocated_seconds_total[30d]))")
        and e.endswith("/ 3600")]
    ((_, ratio),) = node_stack.wait_for_data(f"sum({expr}) / sum({by_namespace})")
    assert ratio == pytest.approx(1.0), result
