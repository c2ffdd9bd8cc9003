"""A small writer for the Prometheus text format (version 0.0.4).

The compatibility profiles must reproduce other exporters' names exactly:
counters without a ``_total`` suffix and camelCase label names, which a
client library would rename. Writing the lines here keeps them as they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class Family:
    """One metric family: a name, its type and help, and its samples."""

    name: str
    type: str
    help: str
    samples: list[tuple[Mapping[str, str], float]] = field(default_factory=list)

    def add(self, labels: Mapping[str, str], value: float) -> None:
        self.samples.append((labels, value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def render(families: Iterable[Family]) -> str:
    """Families with no samples are left out, as exporters usually do."""
    out: list[str] = []
    for family in families:
        if not family.samples:
            continue
        out.append(f"# HELP {family.name} {_escape_help(family.help)}")
        out.append(f"# TYPE {family.name} {family.type}")
        for labels, value in family.samples:
            if labels:
                pairs = ",".join(f'{k}="{_escape_value(str(v))}"' for k, v in labels.items())
                out.append(f"{family.name}{{{pairs}}} {format_value(value)}")
            else:
                out.append(f"{family.name} {format_value(value)}")
    return "\n".join(out) + ("\n" if out else "")
