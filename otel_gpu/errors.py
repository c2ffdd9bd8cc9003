"""The one error type that stops the collector at start-up.

Every problem found while setting up (a bad setting, scenario, counters file,
web config or OTLP option) is a :class:`SetupError` whose ``str()`` is one
line naming what is wrong; the CLI prints it and exits 2. Anything else that
escapes is a bug.
"""

from __future__ import annotations


class SetupError(ValueError):
    """A start-up problem the user can fix; ``str()`` is one line fit to print."""
