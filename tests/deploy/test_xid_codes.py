"""Every XID code an alert rule or a dashboard panel names has its series at 0 from
discovery on: `increase()` sees a counter's first step only from an existing series,
so a code whose series appears with its first error never fires the first time."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import yaml

from tests.deploy.helpers import DEPLOY

# a label matcher on an XID label: nvidia_gpu_xid (otel names), xid (dcgm), err_code ...
MATCHER = re.compile(
    r"""\b(?P<label>[A-Za-z_]*xid[A-Za-z_]*|err(?:or)?_code)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>[^"]*)\"""")
AT_ZERO = re.compile(r"^\s*nvidia\.gpu\.xid\.errors\{nvidia\.gpu\.xid=(\d+)\}\s+0\s")


def _expressions(node) -> list[str]:
    """Every string under an `expr` key, at any depth (rules, Grafana targets)."""
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in _expressions(value)]
    if isinstance(node, list):
        return [e for item in node for e in _expressions(item)]
    return []


def named_codes() -> dict[int, set[str]]:
    """XID code -> the files whose queries select it (= or =~, alternations split)."""
    sources = [(p, yaml.safe_load(p.read_text())) for p in
               sorted((DEPLOY / "prometheus").glob("*.yaml"))]
    sources += [(p, json.loads(p.read_text())) for p in sorted((DEPLOY / "grafana").glob("*.json"))]
    codes: dict[int, set[str]] = {}
    for path, doc in sources:
        for expr in _expressions(doc):
            for match in MATCHER.finditer(expr):
                if match["op"] in ("!=", "!~") or match["value"].startswith("$"):
                    continue  # an exclusion, or a Grafana variable: no code is required
                for alternative in match["value"].split("|"):
                    assert alternative.isdigit(), (
                        f"{path.name}: {match[0]!r}: name XID codes as plain numbers "
                        "(48|79), so this test can check each one")
                    codes.setdefault(int(alternative), set()).add(path.name)
    return codes


def codes_at_zero() -> set[int]:
    """The XID codes whose series `otel-gpu check` shows at 0 on its first sample."""
    proc = subprocess.run(
        [sys.executable, "-m", "otel_gpu", "check", "--simulate", "t4",
         "--pod-attribution", "false"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {int(m[1]) for m in map(AT_ZERO.match, proc.stdout.splitlines()) if m}


def test_the_matcher_reads_alternations_and_skips_exclusions():
    expr = ('increase(nvidia_gpu_xid_errors_total{nvidia_gpu_xid=~"48|79|140"}[5m]) '
            '+ DCGM_FI_DEV_XID_ERRORS{xid="13"} unless x{nvidia_gpu_xid!="31"}')
    found = [(m["label"], m["op"], m["value"]) for m in MATCHER.finditer(expr)]
    assert found == [("nvidia_gpu_xid", "=~", "48|79|140"), ("xid", "=", "13"),
                     ("nvidia_gpu_xid", "!=", "31")]


def test_every_xid_code_the_rules_and_dashboards_name_is_exported_from_zero():
    named = named_codes()
    assert 79 in named, "no XID matcher found in the rules: the parser missed them"
    at_zero = codes_at_zero()
    assert at_zero, "otel-gpu check showed no XID series at 0"
    missing = {code: sorted(files) for code, files in sorted(named.items())
               if code not in at_zero}
    assert not missing, (
        f"XID codes named by a rule or dashboard but not at 0 from discovery: {missing}; "
        "add them to the sampler's list of XIDs created at 0")
