"""Settings classes built on the real one, to show what a new setting row brings."""

from __future__ import annotations

import dataclasses

from otel_gpu.config import Config, setting


@dataclasses.dataclass(frozen=True)
class ToyConfig(Config):
    """The settings plus one toy row: a flag, a variable, a file key and a help row."""

    toy_limit: int = setting(int, "3", "COUNT", "a toy setting for this test", short="-T",
                             serve_only=True)
