"""docs/scenarios.md shows every key the scenario parser allows, so the format doc keeps up.

The keys are the parser's own: each section is given an unknown key and its
error lists what is allowed there, so a key added to a spec class fails this
test until the doc's YAML reference shows it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from otel_gpu.sim import ScenarioError, load_scenario
from tests.sim.helpers import write

DOC = Path(__file__).parents[2] / "docs" / "scenarios.md"

GPU = "devices: [{name: X, %s}]"
SECTIONS = {
    "top level": "zz_bogus: 1\ndevices: []",
    "devices[]": GPU % "zz_bogus: 1",
    "memory": GPU % "memory: {total: 1, zz_bogus: 1}",
    "VALUE": GPU % "power: {start: 1, zz_bogus: 1}",
    **{name: GPU % f"{name}: {{zz_bogus: 1}}"
       for name in ("utilization", "clocks", "max_clocks", "power_limits", "pcie",
                    "violations", "row_remap_histogram")},
    "processes[]": GPU % "processes: [{pid: 1, zz_bogus: 1}]",
    "mig[]": GPU % "mig: [{profile: 1g.5gb, gpu_instance_id: 1, zz_bogus: 1}]",
    "slow[]": GPU % "slow: [{function: nvmlDeviceGetPowerUsage, seconds: 1, zz_bogus: 1}]",
    "xid[]": GPU % "xid: [{sample: 1, code: 1, zz_bogus: 1}]",
    "nvlink": GPU % "nvlink: {links: [], zz_bogus: 1}",
    "nvlink.links[]": GPU % "nvlink: {links: [{zz_bogus: 1}]}",
    "gpm": GPU % "gpm: {zz_bogus: 1}",
    "gpm.busy": GPU % "gpm: {busy: {zz_bogus: 1}}",
    "node": "devices: []\nnode: {zz_bogus: 1}",
    "node.pods[]": "devices: []\nnode: {pods: [{namespace: a, name: b, zz_bogus: 1}]}",
    "containers[]": "devices: []\nnode: {pods: [{namespace: a, name: b, "
                    "containers: [{name: c, zz_bogus: 1}]}]}",
}
_ALLOWED = re.compile(r"zz_bogus: unknown key \((?:allowed: |expected .* one of: )(.*)\)$")


def allowed_keys(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(write(tmp_path, text + "\n"))
    match = _ALLOWED.search(str(info.value))
    assert match, str(info.value)
    return match.group(1).split(", ")


def yaml_reference() -> str:
    text = DOC.read_text()
    start = text.index("```yaml\n")
    return text[start:text.index("\n```", start + 1)]


@pytest.mark.parametrize("section", SECTIONS)
def test_the_format_doc_shows_every_allowed_key(tmp_path, section):
    keys = allowed_keys(tmp_path, SECTIONS[section])
    assert len(keys) >= 2
    reference = yaml_reference()
    missing = [k for k in keys if not re.search(rf"(?<![\w.]){re.escape(k)}:", reference)]
    assert not missing, f"{section}: keys missing from the YAML reference in {DOC}: {missing}"


def test_the_readme_points_at_the_format_doc():
    readme = (DOC.parents[1] / "README.md").read_text()
    assert "docs/scenarios.md" in readme
