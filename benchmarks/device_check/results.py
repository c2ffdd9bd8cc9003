"""What the check is asked (:class:`Options`) and what it found: one :class:`Row` per
comparison, gathered in a :class:`Result`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Row:
    """One comparison: what was exported, what the reference says, the rule, the result."""

    phase: str
    family: str
    device: str
    what: str
    exported: Any
    reference: Any
    rule: str
    ok: bool
    source: str = "pynvml"
    note: str = ""


@dataclass
class Result:
    """Everything the check found, written as JSON and rendered as markdown."""

    started: str
    mode: str
    command: list[str]
    environment: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    not_compared: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if not r.ok]

    @property
    def passed(self) -> bool:
        return bool(self.rows) and not self.failed and not self.errors

    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"device-check: {text}", file=sys.stderr)


@dataclass
class Options:
    """The command line's choices."""

    out: Path
    simulate: str | None
    reference: str | None
    interval: float
    load_seconds: float
    load_gib: float
    latency_calls: int
    quiet_seconds: float
    scrape_seconds: float
    systems: list[str]
    skip: set[str]
