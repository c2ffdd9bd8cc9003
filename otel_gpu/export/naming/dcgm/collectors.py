"""Reading a dcgm-exporter counters file and choosing the columns it asks for."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from otel_gpu._files import FileError, read_text
from otel_gpu.config import Config
from otel_gpu.config.settings import DCGM_NAMES
from otel_gpu.errors import SetupError
from otel_gpu.export.naming.dcgm.columns import (
    DEFAULT_LABELS,
    EXPORTER_FIELDS,
    LABEL_FIELDS,
    Column,
)
from otel_gpu.export.naming.dcgm.counters import (
    ALIASES,
    DEFAULT_COUNTERS,
    DEFAULT_COUNTERS_CURRENT,
    DEFAULT_FIELDS,
    DEFAULT_FIELDS_CURRENT,
    LEGACY_NAMES,
    UNAVAILABLE,
)
from otel_gpu.export.naming.dcgm.current import CURRENT_FIELDS
from otel_gpu.export.naming.dcgm.fields import FIELDS, DcgmField

KNOWN_FIELDS: Mapping[str, DcgmField] = {**FIELDS, **CURRENT_FIELDS}
"""Every field under either generation's name: a counters file may mix them, and
each name is served in its own unit."""


def _canonical(name: str) -> str:
    """The DCGM_FI_ field a counters-file name stands for (itself for most)."""
    if name in LEGACY_NAMES:
        return LEGACY_NAMES[name]
    if name.startswith("dcgm_fi_"):
        return name.upper()
    if name not in KNOWN_FIELDS and name in ALIASES:
        return ALIASES[name]
    return name

TYPES = ("gauge", "counter", "label", "histogram", "summary")
_NAME = re.compile(r"(?:DCGM_FI_|DCGM_EXP_|dcgm_)[A-Za-z0-9_]+")


class CollectorsError(SetupError):
    """A malformed counters file; ``str()`` names the file and line."""


@dataclass(frozen=True)
class CsvEntry:
    name: str
    type: str
    help: str
    line: int


def parse_collectors(path: str) -> list[CsvEntry]:
    """Reads a dcgm-exporter counters file: ``NAME, type, help`` lines, ``#`` comments.

    NAME is a ``DCGM_FI_`` field, a ``DCGM_EXP_`` exporter field, or a lower-case
    ``dcgm_`` name of dcgm-exporter's 1.x-compatibility file.
    """
    try:
        text = read_text(path, "collectors file")
    except FileError as exc:
        raise CollectorsError(str(exc)) from None
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise CollectorsError(
                f"collectors file {path}: line {number}: expected 'DCGM_FI_NAME, type, help', "
                f"got {_shorten(raw.strip())}"
            )
        name, type_ = parts[0], parts[1].lower()
        if not _NAME.fullmatch(name):
            raise CollectorsError(
                f"collectors file {path}: line {number}: {_shorten(name)} is not a DCGM_FI_ "
                "field name (nor a DCGM_EXP_ or 1.x dcgm_ one)"
            )
        if type_ not in TYPES:
            raise CollectorsError(
                f"collectors file {path}: line {number}: type {_shorten(parts[1])} is not one of "
                f"{', '.join(TYPES)}"
            )
        entries.append(CsvEntry(name, type_, parts[2] if len(parts) > 2 else "", number))
    return entries


def _shorten(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def default_columns(generation: str = Config.dcgm_names) -> list[Column]:
    """The built-in set: NVIDIA's default counters file, with its types and HELP texts,
    under dcgm-exporter's names up to 4.8 (``legacy``) or from 4.9 on (``current``)."""
    if generation not in DCGM_NAMES:
        raise ValueError(f"dcgm_names: expected one of {', '.join(DCGM_NAMES)}")
    rows, chosen = ((DEFAULT_COUNTERS, DEFAULT_FIELDS) if generation == DCGM_NAMES[0]
                    else (DEFAULT_COUNTERS_CURRENT, DEFAULT_FIELDS_CURRENT))
    columns: list[Column] = []
    for name, type_, help_ in rows:
        if name in DEFAULT_LABELS:
            columns.append(LABEL_FIELDS[name])
        elif name in chosen:
            columns.append(replace(KNOWN_FIELDS[name], type=type_, help=help_))
    listed = {name for name, _, _ in rows}
    columns += [KNOWN_FIELDS[name] for name in chosen if name not in listed]
    return columns


def _column(entry: CsvEntry) -> Column | str:
    """The column a counters-file row asks for, or why there is none."""
    name = _canonical(entry.name)
    if entry.type == "label":
        if name in LABEL_FIELDS:
            return replace(LABEL_FIELDS[name], name=entry.name)
        if name in KNOWN_FIELDS or name in EXPORTER_FIELDS:
            return "type label is not supported for it; use gauge or counter"
    elif name in KNOWN_FIELDS:
        if entry.type not in ("gauge", "counter"):
            return f"type {entry.type} is not supported for it; use gauge or counter"
        known = KNOWN_FIELDS[name]
        return replace(known, name=entry.name, dcgm_name=known.name if name != entry.name else "",
                       type=entry.type, help=entry.help or known.help)
    elif name in EXPORTER_FIELDS:
        known_exp = EXPORTER_FIELDS[name]
        if entry.type not in ("gauge", "counter"):
            return f"type {entry.type} is not supported for it; use gauge or counter"
        return replace(known_exp, type=entry.type, help=entry.help or known_exp.help)
    elif name in LABEL_FIELDS:
        return f"type {entry.type} is not supported for it; it is a label field"
    if name in UNAVAILABLE:
        return UNAVAILABLE[name]
    return "not a field otel-gpu knows"


def select_fields(entries: Iterable[CsvEntry] | None,
                  generation: str = Config.dcgm_names) -> tuple[list[Column], list[str]]:
    """The columns to export, and a line per requested field that cannot be (with why).

    ``None`` is the built-in set (:func:`default_columns`) of ``generation``; a
    counters file chooses by its own names, of either generation or both. A name
    listed twice is exported once, as its last line says.
    """
    if entries is None:
        return default_columns(generation), []
    chosen: dict[str, tuple[Column, int]] = {}
    problems: list[str] = []
    for entry in entries:
        column = _column(entry)
        if isinstance(column, str):
            problems.append(f"{entry.name} (line {entry.line}): {column}")
            continue
        if entry.name in chosen:
            problems.append(f"{entry.name} (line {chosen[entry.name][1]}): listed again on line "
                            f"{entry.line}, which is used")
            del chosen[entry.name]
        chosen[entry.name] = (column, entry.line)
    return [column for column, _ in chosen.values()], problems

