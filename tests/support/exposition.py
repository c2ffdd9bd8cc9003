"""Prometheus text exposition, read exactly as written.

A client library's parser renames counters (drops ``_total``) and merges
families; these helpers keep every sample line's own name and labels.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line, in order."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        assert match, f"not an exposition line: {line!r}"
        name, labels, value = match.groups()
        parsed = {
            k: re.sub(r"\\.", lambda m: _UNESCAPE.get(m.group(0), m.group(0)), v)
            for k, v in _LABEL.findall(labels or "")
        }
        out.append((name, parsed, float(value)))
    return out


def series(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of the samples named ``name`` whose labels include ``labels``."""
    return [
        (lab, value)
        for n, lab, value in parse_samples(text)
        if n == name and all(lab.get(k) == v for k, v in labels.items())
    ]
