"""The ``dcgm`` naming profile: dcgm-exporter's field names, units and labels.

Every field is read from the catalog's NVML sources (no extra NVML reads),
converted to dcgm-exporter's unit. The field set is NVIDIA's default counters
file, or the one a dcgm-exporter counters CSV file names (``-f``/``--collectors``):
``DCGM_FI_*`` fields, the 1.x-compatibility file's lower-case ``dcgm_*`` names,
``label`` rows (a label on every series) and the ``DCGM_EXP_*`` values
dcgm-exporter computes itself.

``fields`` and ``counters`` are the tables, ``columns`` the non-field rows,
``collectors`` reads a counters file, ``profile`` renders.
"""

from __future__ import annotations

from otel_gpu.export.naming import ProfileOptions
from otel_gpu.export.naming.dcgm.collectors import (
    CollectorsError,
    CsvEntry,
    default_columns,
    parse_collectors,
    select_fields,
)
from otel_gpu.export.naming.dcgm.columns import (
    CLOCK_EVENTS,
    EXPORTER_FIELDS,
    LABEL_FIELDS,
    WINDOW_SECONDS,
    Column,
    ExporterField,
    LabelField,
)
from otel_gpu.export.naming.dcgm.counters import (
    ALIASES,
    DEFAULT_COUNTERS,
    DEFAULT_FIELDS,
    LEGACY_NAMES,
    UNAVAILABLE,
)
from otel_gpu.export.naming.dcgm.fields import FIELDS, DcgmField
from otel_gpu.export.naming.dcgm.profile import HPC_JOB_LABEL, DcgmProfile

__all__ = [
    "ALIASES", "CLOCK_EVENTS", "DEFAULT_COUNTERS", "DEFAULT_FIELDS",
    "EXPORTER_FIELDS", "FIELDS", "HPC_JOB_LABEL", "LABEL_FIELDS", "LEGACY_NAMES", "NAMING",
    "UNAVAILABLE", "WINDOW_SECONDS", "CollectorsError", "Column", "CsvEntry",
    "DcgmField", "DcgmProfile", "ExporterField", "LabelField", "default_columns",
    "parse_collectors", "select_fields",
]


class _Dcgm:
    name = "dcgm"

    def __init__(self) -> None:
        self._columns: dict[ProfileOptions, tuple[list[Column], list[str]]] = {}

    def _select(self, options: ProfileOptions) -> tuple[list[Column], list[str]]:
        if options not in self._columns:  # read the counters file once per start
            entries = parse_collectors(options.collectors_file) if options.collectors_file \
                else None
            self._columns = {options: select_fields(entries, options.dcgm_names)}
        return self._columns[options]

    def validate(self, options: ProfileOptions) -> list[str]:
        return self._select(options)[1]

    def build(self, options: ProfileOptions) -> DcgmProfile:
        columns, _ = self._select(options)
        return DcgmProfile(columns, options)


NAMING = _Dcgm()
