"""What the running collector is built from: the ``otel_gpu.build.info`` series' attributes.

Exporters conventionally expose one series of value 1 whose labels name their
version and that of what they run on, so that a fleet's versions are one query
away. Read once: none of it changes while the process runs.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Iterable
from importlib import metadata

from otel_gpu import __version__
from otel_gpu.instrument.schema import Observation
from otel_gpu.snapshot import Snapshot

VERSION = "otel_gpu.version"
RUNTIME_VERSION = "process.runtime.version"
PYNVML_VERSION = "otel_gpu.pynvml.version"
SDK_VERSION = "telemetry.sdk.version"
BUILD_ATTRIBUTES = (VERSION, RUNTIME_VERSION, PYNVML_VERSION, SDK_VERSION)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def build_attributes() -> dict[str, str]:
    """The collector's, Python's, the NVML binding's and the OpenTelemetry SDK's versions."""
    return {
        VERSION: __version__,
        RUNTIME_VERSION: platform.python_version(),
        PYNVML_VERSION: _version("nvidia-ml-py"),
        SDK_VERSION: _version("opentelemetry-sdk"),
    }


def build_info(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    yield 1.0, build_attributes()
