"""The README's settings table, generated from the rows (a test keeps README.md in step).

``python -m otel_gpu.config.docs README.md`` rewrites the table between its two
markers in place; nothing else in the file is touched.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from otel_gpu.config.settings import OPTIONS, Option

BEGIN = ("<!-- settings table: generated from otel_gpu/config/settings.py by "
         "`python -m otel_gpu.config.docs README.md`; do not edit -->")
END = "<!-- end of settings table -->"


def _cell(text: str) -> str:
    """Text safe in a table cell: a ``|`` would end the cell, a ``<`` open an HTML tag."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def _default(option: Option) -> str:
    default = option.default
    if default is None or default == "":
        return "not set"
    shown = str(default).lower() if isinstance(default, bool) else str(default)
    return f"`{_cell(shown)}`"


def _flags(option: Option) -> str:
    return ", ".join(f"`{flag} {_cell(option.metavar)}`" for flag in option.flags)


def settings_table(options: Sequence[Option] = OPTIONS) -> str:
    """One row per setting: key, flags, variable, default, and what it does (its help)."""
    lines = [
        "| setting | flag | variable | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for option in options:
        serve = " *(serve only)*" if option.serve_only else ""
        lines.append(
            f"| `{option.key}`{serve} | {_flags(option)} | `{option.env}` | {_default(option)} "
            f"| {_cell(option.help)} |"
        )
    return "\n".join(lines) + "\n"


def with_table(readme: str, table: str | None = None) -> str:
    """``readme`` with the text between the markers replaced by the generated table."""
    head, begin, rest = readme.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError("the settings table markers are missing")
    return f"{head}{BEGIN}\n{table or settings_table()}{END}{tail}"


def main(argv: Sequence[str]) -> int:
    for name in argv:
        path = Path(name)
        path.write_text(with_table(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
