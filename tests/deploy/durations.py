"""Regular expressions for otel-gpu's durations within a range, for the chart's
values.schema.json (a JSON Schema has no arithmetic on strings).

otel-gpu reads a duration as a decimal number and an optional unit (``ms``, ``s``,
``m``, ``h``; none is seconds), spaces allowed around both (otel_gpu/config/values.py,
``parse_duration``). For each unit, :func:`at_least` and :func:`at_most` build one
pattern each: a string in that unit within the range matches both. They compare
exactly, digit by digit, also where a bound is no finite decimal in a unit (100ms
is 1/600 of a minute). ``python -m tests.deploy.durations`` rewrites the schema's
duration definitions after a range changed in otel_gpu/config/settings.py.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

from tests.deploy.schema_text import explained

UNITS = {"ms": Fraction(1, 1000), "s": Fraction(1), "m": Fraction(60), "h": Fraction(3600)}
ANY_FRACTION = r"(?:\.[0-9]+)?"


def _alternatives(parts: list[str]) -> str:
    parts = list(dict.fromkeys(p for p in parts if p is not None))
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _digit_class(low: int, high: int) -> str | None:
    """The digits low..high as a character class; None when that is no digit."""
    if low > high:
        return None
    if low == high:
        return str(low)
    return "[0-9]" if (low, high) == (0, 9) else f"[{low}-{high}]"


def _repeat(least: int, most: int | None) -> str:
    """least..most more digits (most None: no end)."""
    if most is None:
        return "[0-9]*" if least == 0 else f"[0-9]{{{least},}}"
    if least == most:
        return "" if least == 0 else "[0-9]" if least == 1 else f"[0-9]{{{least}}}"
    return f"[0-9]{{{least},{most}}}"


def _integers(low: int, high: int | None) -> str | None:
    """Integers low..high (high None: no end), written without leading zeros; low >= 1."""
    if high is not None and low > high:
        return None
    end = high if high is not None else 10 ** len(str(low)) - 1
    # blocks: (prefix, first digit, last digit, fewest more digits, most more digits)
    blocks: list[tuple[str, int, int, int, int | None]] = []
    start = low
    while start <= end:
        tail = 0
        while start % 10 ** (tail + 1) == 0 and start + 10 ** (tail + 1) - 1 <= end:
            tail += 1
        head = str(start // 10 ** tail)
        prefix, digit = head[:-1], int(head[-1])
        last = blocks[-1] if blocks else None
        if last and last[0] == prefix and last[3] == tail and last[2] == digit - 1:
            blocks[-1] = (prefix, last[1], digit, tail, tail)
        else:
            blocks.append((prefix, digit, digit, tail, tail))
        start += 10 ** tail
    if high is None:  # and every number with more digits
        blocks.append(("", 1, 9, len(str(low)), None))
    merged: list[tuple[str, int, int, int, int | None]] = []
    for block in blocks:  # [1-9], [1-9][0-9], [1-9][0-9]{2} ... as [1-9][0-9]{0,2}
        last = merged[-1] if merged else None
        if last and last[:3] == block[:3] and last[4] is not None and last[4] + 1 == block[3]:
            merged[-1] = (*last[:4], block[4])
        else:
            merged.append(block)
    return _alternatives([p + _digit_class(a, b) + _repeat(t, u) for p, a, b, t, u in merged])


def _integer_part(low: int, high: int | None) -> str | None:
    """The integer part of a number, low..high, leading zeros allowed (high None: no end)."""
    parts = []
    if low == 0:
        parts.append("0+")
    positive = _integers(max(low, 1), high)
    if positive is not None:
        parts.append("0*" + positive)
    return _alternatives(parts) if parts else None


def _expansion(fraction: Fraction) -> tuple[str, str]:
    """The decimal digits of 0 <= fraction < 1: (those before the period, the period),
    the period empty when the expansion ends."""
    digits: list[str] = []
    seen: dict[int, int] = {}
    rest = fraction.numerator % fraction.denominator
    while rest and rest not in seen:
        seen[rest] = len(digits)
        rest *= 10
        digits.append(str(rest // fraction.denominator))
        rest %= fraction.denominator
    if not rest:
        return "".join(digits), ""
    return "".join(digits[:seen[rest]]), "".join(digits[seen[rest]:])


def _fraction_at_least(fraction: Fraction) -> str:
    """The optional `.digits` part of a number whose fractional value is >= fraction."""
    if fraction == 0:
        return ANY_FRACTION
    head, period = _expansion(fraction)
    parts = [head[:i] + _digit_class(int(d) + 1, 9) + "[0-9]*"
             for i, d in enumerate(head) if d != "9"]
    if period:  # the digits never end: a finite fraction is never equal
        loop = f"(?:{period})*" if len(period) > 1 else f"{period}*"
        parts += [head + loop + period[:j] + _digit_class(int(d) + 1, 9) + "[0-9]*"
                  for j, d in enumerate(period) if d != "9"]
    else:
        parts.append(head + "[0-9]*")
    return r"\." + _alternatives(parts)


def _fraction_at_most(fraction: Fraction) -> str:
    """The optional `.digits` part of a number whose fractional value is <= fraction."""
    if fraction == 0:
        return r"(?:\.0+)?"
    head, period = _expansion(fraction)
    parts = [head[:i] + _digit_class(0, int(d) - 1) + "[0-9]*"
             for i, d in enumerate(head) if d != "0"]
    parts += [head[:i] for i in range(1, len(head) + 1)]  # prefixes: the rest counts as 0s
    if period:
        loop = f"(?:{period})*" if len(period) > 1 else f"{period}*"
        parts += [head + loop + period[:j] + _digit_class(0, int(d) - 1) + "[0-9]*"
                  for j, d in enumerate(period) if d != "0"]
        parts += [head + loop + period[:j] for j in range(1, len(period) + 1)]
    else:
        parts.append(head + "0*")
    return r"(?:\." + _alternatives([p for p in parts if p]) + ")?"


def _number_at_least(low: Fraction) -> str:
    whole = low.numerator // low.denominator
    parts = [_integer_part(whole + 1, None) + ANY_FRACTION,
             _integer_part(whole, whole) + _fraction_at_least(low - whole)]
    return _alternatives(parts)


def _number_at_most(high: Fraction) -> str:
    whole = high.numerator // high.denominator
    parts = [_integer_part(whole, whole) + _fraction_at_most(high - whole)]
    below = _integer_part(0, whole - 1) if whole >= 1 else None
    if below is not None:
        parts.insert(0, below + ANY_FRACTION)
    return _alternatives(parts)


# How the unit of a duration is told apart: the last thing before any trailing spaces.
UNIT_OF = {"ms": r"ms\s*$", "s": r"[0-9.\s]s?\s*$", "m": r"[0-9.\s]m\s*$", "h": r"h\s*$"}
SYNTAX = r"^\s*[0-9]+(?:\.[0-9]+)?\s*(?:ms|s|m|h)?\s*$"


def _pattern(number: str, unit: str) -> str:
    return rf"^\s*{number}\s*{'s?' if unit == 's' else unit}\s*$"


def at_least(seconds: float, unit: str) -> str:
    """Durations in ``unit`` (s: seconds, with or without the s) of at least ``seconds``
    (a value otel_gpu.config writes exactly)."""
    return _pattern(_number_at_least(Fraction(str(seconds)) / UNITS[unit]), unit)


def at_most(seconds: float, unit: str) -> str:
    """Durations in ``unit`` of at most ``seconds``."""
    return _pattern(_number_at_most(Fraction(str(seconds)) / UNITS[unit]), unit)


def definition(span: str) -> dict:
    """The schema of a duration within ``span`` (``100ms to 1h``, as otel_gpu.config says
    it): a number of seconds within it, or a string whose unit's range patterns it
    matches. Helm's message for a bad one quotes the pattern of its own unit only."""
    low, high = (_seconds(part) for part in span.split(" to "))
    allowed = (f"a duration from {span}: seconds (a number), or a number and ms, s, m or h "
               "(500ms, 10s, 5m, 1h)")
    return explained({
        "description": allowed,
        "type": ["number", "string"],
        "minimum": low,
        "maximum": high,
        "pattern": SYNTAX,
        "allOf": [{"if": {"pattern": UNIT_OF[unit]},
                   "then": {"allOf": [{"pattern": at_least(low, unit)},
                                      {"pattern": at_most(high, unit)}]}}
                  for unit in UNITS],
    }, allowed)


def _seconds(text: str) -> float:
    from otel_gpu.config import parse_duration

    return parse_duration(text)


def definitions() -> dict[str, dict]:
    """The duration definitions of values.schema.json: one per range otel-gpu's
    duration settings have (``duration_100ms_1h`` ...)."""
    from otel_gpu.config import settings

    spans = sorted({parse.span for option in settings.OPTIONS
                    if (parse := getattr(settings, option.key.upper(), None)) is not None
                    and hasattr(parse, "span")})
    return {"duration_" + span.replace(" to ", "_"): definition(span) for span in spans}


def rewrite(path: Path) -> None:
    """Rewrite the duration definitions of the schema at ``path``, the rest unchanged."""
    schema = json.loads(path.read_text())
    schema["definitions"] = {**schema.get("definitions", {}), **definitions()}
    path.write_text(json.dumps(schema, indent=2) + "\n")


if __name__ == "__main__":  # python -m tests.deploy.durations: after a range changed
    rewrite(Path(__file__).resolve().parents[2] / "deploy/helm/otel-gpu/values.schema.json")
