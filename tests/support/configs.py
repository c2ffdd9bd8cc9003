"""Settings classes built on the real one, to show what a new setting row brings."""

from __future__ import annotations

import dataclasses
import sys

from otel_gpu.config import Config, setting


@dataclasses.dataclass(frozen=True)
class ToyConfig(Config):
    """The settings plus one toy row: a flag, a variable, a file key and a help row."""

    toy_limit: int = setting(int, "3", "COUNT", "a toy setting for this test", short="-T",
                             serve_only=True)


def help_invocation(flags: tuple[str, ...] | list[str], metavar: str) -> str:
    """A flag's row in ``--help`` as this Python's argparse writes it: the metavar after
    every flag (``-f CSV, --collectors CSV``), or after the last one only from 3.13 on."""
    if sys.version_info >= (3, 13):
        return ", ".join(flags) + f" {metavar}"
    return ", ".join(f"{flag} {metavar}" for flag in flags)
