"""Value parsers: one raw value (YAML, a variable, a flag) -> the setting's typed value.

Each parser raises ``ValueError`` saying what was expected and what it got, in
words a user can act on (never a Python type name); a value of the wrong kind
(a list, a mapping, binary data, a date, a value YAML could not read as its
tag) is refused by the parser of the setting, so the message says what that
setting takes.
"""

from __future__ import annotations

import datetime
import ipaddress
import math
import re
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from otel_gpu._files import Unreadable

T = TypeVar("T")
S = TypeVar("S", bound=str)

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {None: 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def show(value: object) -> str:
    """``repr(value)``, cut short: a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def kind(value: object) -> str:
    """What a YAML value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (set, frozenset)):
        return "a set"
    if isinstance(value, (bytes, bytearray)):
        return "binary data"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"a date ({value})"
    if isinstance(value, Unreadable):
        return str(value)
    return show(value)


def parse_duration(value: object) -> float:
    """``10``, ``2.5``, ``500ms``, ``10s``, ``1m`` -> seconds (finite, > 0)."""
    expected = f"expected a duration like 10s, 500ms or 2.5, got {kind(value)}"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(expected)
    try:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            match = _DURATION.match(value)
            if not match:
                raise ValueError(expected)
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError(f"must be a finite duration, got {show(value)}")
    if not seconds > 0:
        raise ValueError(f"must be greater than 0, got {show(value)}")
    return seconds


def format_duration(seconds: float) -> str:
    """``0.1`` -> ``100ms``, ``300`` -> ``5m``, ``86400`` -> ``24h``."""
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


class DurationIn:
    """:func:`parse_duration`, limited to ``minimum``..``maximum`` seconds (both included);
    ``span`` says the range the way the help and the errors say it."""

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum, self.maximum = minimum, maximum
        self.span = f"{format_duration(minimum)} to {format_duration(maximum)}"

    def __call__(self, value: object) -> float:
        seconds = parse_duration(value)
        if not self.minimum <= seconds <= self.maximum:
            raise ValueError(f"must be from {self.span}, got {show(value)}")
        return seconds


def duration_in(minimum: float, maximum: float) -> DurationIn:
    return DurationIn(minimum, maximum)


_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


def is_host(text: str) -> bool:
    """An IP address (IPv6 with or without brackets) or a host name."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(text)) and len(text) <= 253


def parse_listen(value: object) -> tuple[str, int]:
    """``0.0.0.0:9400``, ``:9400``, ``[::]:9400`` -> (host, port)."""
    expected = f"expected HOST:PORT such as 0.0.0.0:9400, got {kind(value)}"
    if not isinstance(value, str):
        raise ValueError(expected)
    host, sep, port = value.strip().rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port):
        raise ValueError(expected)
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"port must be 0..65535, got {number}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host or ":" not in host:
            raise ValueError(f"expected an IPv6 address between [ and ], got {show(value)}")
    host = host or "0.0.0.0"
    if not is_host(host):
        raise ValueError(f"{show(host)} is not an IP address or host name")
    return host, number


def choice(allowed: tuple[S, ...], *, exact: bool = False) -> Callable[[object], S]:
    """One of ``allowed``; case-insensitive unless ``exact`` (label names are not)."""

    def parse(value: object) -> S:
        text = value.strip() if isinstance(value, str) else ""
        if not exact:
            text = text.lower()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {kind(value)}")
        return allowed[allowed.index(text)]  # typed as one of them (a Literal, where declared)

    return parse


def parse_bool(value: object) -> bool:
    """YAML booleans, and true/false/yes/no/on/off/1/0 from variables and flags."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else ""
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"expected true or false, got {kind(value)}")


def _item(value: object, position: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a list of names, but item {position} is {kind(value)}")
    text = str(value).strip()
    if _CONTROL.search(text):
        raise ValueError(f"item {position} contains a control character")
    return text


def parse_list(value: object) -> tuple[str, ...]:
    """A YAML list, or a comma-separated string."""
    if isinstance(value, (list, tuple)):
        items = [_item(item, i) for i, item in enumerate(value, 1)]
    elif value is None or isinstance(value, str):
        items = [_item(item, i) for i, item in enumerate((value or "").split(","), 1)]
    else:
        raise ValueError(f"expected a list or a comma-separated string, got {kind(value)}")
    return tuple(item for item in items if item)


def optional(parse: Callable[[object], T]) -> Callable[[object], T | None]:
    """``parse``, except that empty means "not set" (left to the OTEL_* variables)."""

    def parse_optional(value: object) -> T | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return parse(value)

    return parse_optional


def names_in(allowed: tuple[str, ...]) -> Callable[[object], tuple[str, ...]]:
    """Some of ``allowed`` (a YAML list or comma-separated), each once, at least one."""
    some = f"{', '.join(allowed[:-1])} and/or {allowed[-1]}" if len(allowed) > 1 else allowed[0]

    def parse(value: object) -> tuple[str, ...]:
        names = parse_list(value)
        if not names:
            raise ValueError(f"expected at least one of {', '.join(allowed)}")
        for name in names:
            if name not in allowed:
                raise ValueError(f"expected {some}, got {show(name)}")
        return tuple(dict.fromkeys(names))

    return parse


def unless_empty(parse: Callable[[object], T]) -> Callable[[object], T | None]:
    """``parse``, except that a list with no names means "not set"."""

    def parse_some(value: object) -> T | None:
        return parse(value) if parse_list(value) else None

    return parse_some


def text(value: object) -> str:
    """A string (a number is taken as written); no control characters; may be empty."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a string, got {kind(value)}")
    result = str(value).strip()
    if _CONTROL.search(result):
        raise ValueError(f"contains a control character: {show(result)}")
    return result


def required_text(value: object) -> str:
    result = text(value)
    if not result:
        raise ValueError("must not be empty")
    return result


def optional_text(value: object) -> str | None:
    return None if value is None else text(value) or None


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def parse_endpoint(value: object) -> str:
    """``http[s]://host[:port][/path]``, or ``host:port`` (gRPC)."""
    given = required_text(value)
    if any(ch.isspace() for ch in given):
        raise ValueError(f"must not contain spaces: {show(given)}")
    if not _URL.match(given):
        host, sep, port_text = given.rpartition(":")
        if not sep or not host or not is_host(host.strip("[]")) or not port_text.isdigit():
            raise ValueError(f"expected a URL such as http://collector:4318, got {show(given)}")
        return given
    try:
        url = urlsplit(given)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc}): {show(given)}") from None
    if url.scheme.lower() not in ("http", "https"):
        raise ValueError(f"expected an http:// or https:// URL, got {show(given)}")
    if not url.hostname:
        raise ValueError(f"expected a URL with a host, such as http://collector:4318, "
                         f"got {show(given)}")
    if port == 0:
        raise ValueError(f"port must be 1..65535, got {show(given)}")
    return given
