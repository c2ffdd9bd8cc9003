"""The benchmark's own tests: they import ``benchmarks`` and ``testkit``, never ``tests``."""

from __future__ import annotations

import pytest

SLOW = ("benchmarks/tests/test_benchmarks.py",)
"""Where the ``slow`` marker goes (the benchmark's quick run and its in-process runs), as
``tests/conftest.py`` marks its own long runs: by place."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark by place, so a new test in a slow file is slow without anyone remembering to."""
    for item in items:
        if item.nodeid.split("::", 1)[0].startswith(SLOW):
            item.add_marker(pytest.mark.slow)
