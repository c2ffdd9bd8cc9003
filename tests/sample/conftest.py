"""The answer-shape matrix says its size: one line after any run that included it."""

from __future__ import annotations

import pytest

_MATRIX = "tests/sample/test_answer_shapes.py"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    ran = any(getattr(report, "nodeid", "").startswith(_MATRIX)
              for reports in terminalreporter.stats.values() for report in reports)
    if ran:
        from tests.support.answer_shapes import matrix_summary

        terminalreporter.write_line(matrix_summary())
