"""The alert rules: promtool checks them, and each rule has a firing and a quiet case."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.deploy.helpers import DEPLOY, RULES, tool

TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yaml"))


def _alerts() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules():
    promtool = tool("promtool", "Debian: apt-get install prometheus")
    proc = subprocess.run([promtool, "check", "rules", str(RULES)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in proc.stdout


def test_promtool_rule_tests_pass():
    promtool = tool("promtool", "Debian: apt-get install prometheus")
    assert TESTS
    proc = subprocess.run([promtool, "test", "rules", *map(str, TESTS)],
                          cwd=TESTS[0].parent, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(TESTS), proc.stdout


def test_every_alert_has_a_firing_and_a_quiet_case():
    fires, quiet = set(), set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = set(_alerts())
    assert len(alerts) >= 16
    assert alerts - fires == set(), "alerts no test sees firing"
    assert alerts - quiet == set(), "alerts no test sees quiet"
    assert (fires | quiet) <= alerts, "tests name alerts the rules do not have"


def _rule(name: str) -> dict:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == name]
    return rule


def test_the_idle_alert_waits_as_long_as_the_collectors_log_record():
    """The alert and the collector's idle record (idle_threshold) speak of the same idle."""
    from otel_gpu.config import load

    expr = _rule("OtelGpuAllocationIdle")["expr"]
    families = re.findall(r"nvidia_gpu_(k8s|container|hpc)_idle_duration_seconds", expr)
    assert sorted(families) == ["container", "hpc", "k8s"]
    thresholds = {float(t) for t in re.findall(r">= (\d+)", expr)}
    assert thresholds == {load({}, environ={}).idle_threshold}, expr
