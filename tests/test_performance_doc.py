"""docs/performance.md's benchmark tables are the report command's output for the run they name.

The tables are copied from ``python -m benchmarks.report FILE`` for a run committed
under benchmarks/results/; this keeps them so (a hand edit, or a new run without the
doc, fails here). No timing is asserted: the figures are whatever that run measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.report import document

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
BLOCK = re.compile(
    r"<!-- tables: python -m benchmarks\.report (?P<path>\S+) -->\n(?P<body>.*?)"
    r"<!-- end of tables -->", re.S)


def test_the_tables_are_the_report_of_the_run_they_name() -> None:
    blocks = list(BLOCK.finditer(DOC.read_text()))
    assert len(blocks) == 1, "docs/performance.md holds one block of generated tables"
    path = ROOT / blocks[0]["path"]
    assert path.parent == ROOT / "benchmarks" / "results" and path.is_file(), path
    expected = document(json.loads(path.read_text()))
    assert blocks[0]["body"].strip("\n") == expected.strip("\n"), (
        f"regenerate with: python -m benchmarks.report {blocks[0]['path']}")


def test_the_run_covers_every_node_and_says_where_it_ran() -> None:
    from benchmarks.scenarios import NODES

    path = ROOT / BLOCK.search(DOC.read_text())["path"]  # type: ignore[index]
    run = json.loads(path.read_text())
    assert set(run["results"]) == set(NODES)
    meta = run["meta"]
    assert meta["machine"] and meta["date"] and meta["load_before"]
    assert meta["nodes"] == {name: {"reps": node.reps,
                                    "interval": node.interval or 1.0}
                             for name, node in NODES.items()}


def test_no_section_waits_for_a_full_run() -> None:
    assert "not yet from a full run" not in DOC.read_text().lower()


def test_the_block_fails_on_a_changed_figure(tmp_path: Path) -> None:
    """The comparison can fail: one figure changed in a copy of the run no longer matches."""
    text = DOC.read_text()
    block = BLOCK.search(text)
    assert block is not None
    run = json.loads((ROOT / block["path"]).read_text())
    first = run["results"]["gpus-1"]["otel-gpu"][0]["paced"]
    first["cpu_per_interval_ms"] = first["cpu_per_interval_ms"] * 3 + 1
    assert document(run).strip("\n") != block["body"].strip("\n")
