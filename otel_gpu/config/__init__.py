"""Configuration: defaults <- YAML file <- ``OTEL_GPU_*`` variables <- flags.

Each setting is one typed field of :class:`Config` whose metadata carries its
row (:mod:`otel_gpu.config.settings`); :data:`OPTIONS`, the rows, is read off
the fields. The CLI flags and their help, the environment variable names, the
config file keys, the README settings table (:mod:`otel_gpu.config.docs`) all
come from the rows, and ``config/otel-gpu.yaml`` is checked against them.
Adding a setting is adding a field, plus its consumer. Every bad value becomes
one :class:`ConfigError` whose message names the setting, where it came from,
and what it takes.
"""

from otel_gpu.config.loading import ConfigError, load, unknown_variables
from otel_gpu.config.settings import (
    CONFIG_ENV,
    ENV_PREFIX,
    OPTIONS,
    Config,
    Option,
    options_of,
    setting,
)
from otel_gpu.config.values import (
    DurationIn,
    duration_in,
    format_duration,
    parse_bool,
    parse_duration,
    parse_endpoint,
    parse_list,
    parse_listen,
)

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "OPTIONS",
    "Config",
    "ConfigError",
    "DurationIn",
    "Option",
    "duration_in",
    "format_duration",
    "load",
    "options_of",
    "parse_bool",
    "parse_duration",
    "parse_endpoint",
    "parse_list",
    "parse_listen",
    "setting",
    "unknown_variables",
]
