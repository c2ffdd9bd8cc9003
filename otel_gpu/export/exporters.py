"""The one registry of the exporters, each behind :class:`~otel_gpu.export.seam.Exporter`.

The checks ``serve`` and ``check`` make before starting (:func:`validate`) and the
service (:func:`select`, :func:`settle`, then each exporter's methods in the seam's order) read
:data:`REGISTRY`: adding an exporter is its module, a class with the seam's
shape built from the typed config, and one line there (plus its name in
``config.settings.EXPORTERS``, the ``exporters`` setting's choices).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from otel_gpu.config import Config
from otel_gpu.errors import SetupError
from otel_gpu.export import sdk_env
from otel_gpu.export.otlp.exporter import OtlpLogsExporter, OtlpMetricsExporter
from otel_gpu.export.prometheus.exporter import PrometheusExporter
from otel_gpu.export.seam import Exporter

REGISTRY: tuple[Callable[[Config, Mapping[str, str]], Exporter], ...] = (
    PrometheusExporter,
    OtlpMetricsExporter,
    OtlpLogsExporter,
)
"""Every exporter, in the order they are started."""
NAMES: tuple[str, ...] = tuple(dict.fromkeys(str(getattr(make, "name"))  # noqa: B009
                                             for make in REGISTRY))
"""The names the ``exporters`` setting may choose: ``config.settings.EXPORTERS``, which the
settings' parser, help text and the Helm schema offer (a test keeps them the same)."""


def select(config: Config, environ: Mapping[str, str]) -> list[Exporter]:
    """The exporters to run: the ``exporters`` setting, else those on by default."""
    every = [make(config, environ) for make in REGISTRY]
    if not config.exporters:
        return [e for e in every if e.default_on()]
    unknown = [n for n in config.exporters if n not in NAMES]
    if unknown:
        raise SetupError(f"exporters: unknown exporter {unknown[0]!r} (known: "
                         f"{', '.join(NAMES)})")
    return [e for e in every if e.name in config.exporters]


def validate(config: Config, environ: Mapping[str, str]) -> list[Exporter]:
    """The OpenTelemetry SDK's own variables, then each selected exporter's checks."""
    sdk_env.check(environ)
    chosen = select(config, environ)
    for exporter in chosen:
        exporter.validate()
    return chosen


def settle(chosen: Sequence[Exporter], environ: Mapping[str, str]) -> None:
    """What the service runs first: the SDK's variables and those of ``chosen``."""
    sdk_env.settle(environ, tuple(v for e in chosen for v in e.variables))
