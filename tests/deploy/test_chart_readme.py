"""Every file or directory of the repository the chart's README cites exists (paths
move: otel_gpu/config.py became the package otel_gpu/config/)."""

from __future__ import annotations

import re

from tests.deploy.helpers import CHART, ROOT

README = CHART / "README.md"


def _cited_paths(text: str) -> list[str]:
    """Code spans and link targets shaped like a relative path: a/b, a/b.ext, a/b/; not a
    label or API group (its first part has a dot: nvidia.com/gpu.present) nor a pod path."""
    spans = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)\s#]+)\)", text)
    path = re.compile(r"[A-Za-z0-9_][\w-]*(?:/[\w.-]+)+/?")
    return [s for s in spans if path.fullmatch(s) and "://" not in s]


def _missing(text: str) -> list[str]:
    return [p for p in _cited_paths(text)
            if not (ROOT / p).exists() and not (CHART / p).exists()]


def test_every_path_the_chart_readme_cites_exists():
    text = README.read_text()
    cited = set(_cited_paths(text))
    assert {"deploy/prometheus/otel-gpu-rules.yaml", "files/otel-gpu.json",
            "otel_gpu/config/settings.py", "examples/web-config.yml"} <= cited, cited
    assert _missing(text) == []


def test_a_path_that_moved_is_reported():
    text = "ranges in `otel_gpu/config.py`, labels like `nvidia.com/gpu.present=true`"
    assert _missing(text) == ["otel_gpu/config.py"]
    assert _missing("`k8s.amazonaws.com/accelerator`, `/etc/otel-gpu/web`") == []
