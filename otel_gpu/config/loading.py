"""Merging the sources of settings: defaults <- YAML file <- ``OTEL_GPU_*`` <- flags."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

from otel_gpu._files import FileError, Unreadable, load_yaml_fields
from otel_gpu.config import settings
from otel_gpu.config.values import optional_text, show
from otel_gpu.errors import SetupError

FOREIGN_PREFIX = "DCGM_"
"""What every variable :mod:`otel_gpu.config.foreign` answers starts with."""


class ConfigError(SetupError):
    """A bad setting; ``str()`` is one line fit to print before exiting 2."""


def _read_file(path: str) -> dict[str, object]:
    try:
        doc = load_yaml_fields(path, "config file", fields="settings")
    except FileError as exc:
        raise ConfigError(str(exc)) from None
    known = {o.key for o in settings.OPTIONS}
    result: dict[str, object] = {}
    for key, value in doc.items():
        if not isinstance(key, str) or key not in known:
            shown = str(key) if isinstance(key, Unreadable) else show(key)
            raise ConfigError(
                f"config file {path}: unknown key {shown}{_did_you_mean(key, known)}; "
                f"known keys: {', '.join(sorted(known))}"
            )
        result[key] = value
    return result


def _did_you_mean(name: object, known: set[str] | frozenset[str], prefix: str = "") -> str:
    """`` (did you mean X?)`` for the closest of ``known``, judged without the ``prefix`` they
    all share (which would make any two names look alike); empty when none is close."""
    if not isinstance(name, str):
        return ""
    tails = {key.removeprefix(prefix): key for key in known}
    close = difflib.get_close_matches(name.removeprefix(prefix), sorted(tails), n=1)
    return f" (did you mean {tails[close[0]]}?)" if close else ""


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per ``OTEL_GPU_*`` variable that is no setting (a typo is otherwise ignored
    where the same typo in the config file is an error), naming the closest one."""
    env = os.environ if environ is None else environ
    known = frozenset({settings.CONFIG_ENV} | {o.env for o in settings.OPTIONS})
    return [
        f"environment variable {name} is not a setting and is ignored"
        f"{_did_you_mean(name, known, settings.ENV_PREFIX)}"
        for name in sorted(env)
        if name.startswith(settings.ENV_PREFIX) and name not in known
    ]


def refuse_foreign_variables(environ: Mapping[str, str]) -> None:
    """dcgm-exporter's variables, answered as its flags are (:mod:`.foreign`): one line
    naming otel-gpu's variable for the first, and the names of the others."""
    if not any(name.startswith(FOREIGN_PREFIX) for name in environ):
        return  # the tables of other exporters' options are loaded only when one shows
    from otel_gpu.config.foreign import foreign_variables

    lines = foreign_variables(environ)
    if lines:
        more = [line.split()[2] for line in lines[1:]]
        also = f" (also set: {', '.join(more)})" if more else ""
        raise ConfigError(lines[0] + also)


def load(
    flags: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> settings.Config:
    """Merge every source; later sources override earlier ones.

    ``flags`` holds only the flags the user gave (key -> raw value).
    ``config_file`` defaults to ``$OTEL_GPU_CONFIG``. A key set to null in the
    file counts as absent: the setting keeps its default (or the variable's or
    flag's value).
    """
    flags = dict(flags or {})
    env = os.environ if environ is None else environ
    refuse_foreign_variables(env)
    path = config_file or env.get(settings.CONFIG_ENV) or None
    from_file = _read_file(path) if path else {}
    values: dict[str, object] = {}
    origins: dict[str, str] = {}
    for option in settings.OPTIONS:
        raw, origin = option.default, "default"
        if from_file.get(option.key) is not None:
            raw, origin = from_file[option.key], f"config file {path}"
        if option.env in env:
            raw, origin = env[option.env], f"environment variable {option.env}"
        if flags.get(option.key) is not None:
            raw, origin = flags[option.key], f"flag {'/'.join(option.flags)}"
        origins[option.key] = origin
        try:
            values[option.key] = option.parse(raw) if raw is not None else None
        except (ValueError, TypeError, OverflowError) as exc:
            raise ConfigError(f"{option.key} (from {origin}): {_one_line(exc)}") from None
    if values["node_name"] is None:
        try:
            values["node_name"] = optional_text(env.get("NODE_NAME"))
        except ValueError as exc:
            raise ConfigError(f"node_name (from environment variable NODE_NAME): {exc}") from None
    naming = values["naming"]
    if values["collectors"] is not None and isinstance(naming, tuple) and "dcgm" not in naming:
        raise ConfigError(
            f"collectors (from {origins['collectors']}): a counters file is only used by the "
            f"dcgm naming profile, and naming is {','.join(naming)}; add dcgm to "
            "naming (e.g. --naming otel,dcgm) or leave collectors unset"
        )
    return settings.Config(**values)  # type: ignore[arg-type]  # each value parsed by its row


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or exc.__class__.__name__
