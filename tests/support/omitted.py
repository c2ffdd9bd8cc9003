"""Reading the node's "not available" log line back: which value was said with which reason,
on which devices (the line says each reason once, after its values: ``a, b (NOT_SUPPORTED)
on GPU 0``)."""

from __future__ import annotations


def reasons(line: str) -> dict[str, tuple[str, str]]:
    """``{value: (reason, where)}`` for each clause of the line naming devices (the MIG
    instances' count clause aside); a value said with no reason has ``""``."""
    _, _, body = line.partition(": ")
    found: dict[str, tuple[str, str]] = {}
    for clause in body.split("; "):
        if "value(s) on" in clause:
            continue
        values, _, where = clause.rpartition(" on ")
        pending: list[str] = []
        for token in values.split(", "):
            name, _, reason = token.partition(" (")
            pending.append(name)
            if reason:
                found.update((n, (reason.rstrip(")"), where)) for n in pending)
                pending = []
        found.update((n, ("", where)) for n in pending)
    return found
