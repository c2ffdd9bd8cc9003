"""docs/performance.md's figures are the report command's output for the runs they name.

The tables are copied from ``python -m benchmarks.report FILE`` for runs committed under
benchmarks/results/ (the default run and the side-by-side one); the medians and the goals
quoted beside them are read back from those tables. A hand edit, or a new run without the
page, fails here. No timing is asserted: the figures are whatever the runs measured.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from benchmarks.report import FIGURES, render

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "performance.md"
HISTORY = ROOT / "docs" / "performance-history.md"
BLOCK = re.compile(
    r"<!-- tables: python -m benchmarks\.report (?P<path>\S+) -->\n(?P<body>.*?)"
    r"<!-- end of tables -->", re.S)
MEDIANS = re.compile(r"<!-- medians -->\n(?P<body>.*?)<!-- end of medians -->", re.S)
GOALS = re.compile(r"<!-- goals -->\n(?P<body>.*?)<!-- end of goals -->", re.S)
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]\d+)?")

LABELS = {label for _, _, label in FIGURES}
PACED = "server CPU per sample interval, one gzip scrape per sample (ms)"
COLUMNS = {
    "CPU per sample interval, 1 GPU (ms)": ("gpus-1", PACED),
    "CPU per sample interval, 8 GPUs (ms)": ("gpus-8", PACED),
    "CPU per cached scrape, 8 GPUs (ms)": ("gpus-8", "server CPU per cached scrape (ms)"),
    "cached scrape p50, 8 GPUs (ms)": ("gpus-8", "cached scrape p50 (ms)"),
    "RSS, 8 GPUs (MiB)": ("gpus-8", "RSS (MiB)"),
    "series, 8 GPUs": ("gpus-8", "series"),
    "gzip body, 8 GPUs (kB)": ("gpus-8", "body as served with gzip (kB)"),
}
"""The medians table's columns: the node and the report's figure each is read from."""


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def blocks(text: str | None = None) -> list[re.Match[str]]:
    return list(BLOCK.finditer(DOC.read_text() if text is None else text))


def run_of(block: re.Match[str]) -> dict:
    return json.loads((ROOT / block["path"]).read_text())


def default_block(text: str | None = None) -> re.Match[str]:
    found = [block for block in blocks(text) if "meta" in run_of(block)]
    assert len(found) == 1, "docs/performance.md holds the tables of one default run"
    return found[0]


def node_tables(body: str) -> dict[str, dict[str, dict[str, str]]]:
    """The report's tables: node -> figure label -> system -> cell."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    node, systems = "", []
    for line in body.splitlines():
        if line.startswith("### "):
            node = line[4:].split(" ")[0]
            out[node] = {}
        elif line.startswith("| figure |"):
            systems = [s for s in cells(line)[1:] if "/" not in s]
        elif line.startswith("| ") and node and cells(line)[0] in LABELS:
            row = cells(line)
            out[node][row[0]] = dict(zip(systems, row[1:1 + len(systems)], strict=True))
    return out


def test_every_block_is_the_report_of_the_run_it_names() -> None:
    found = blocks()
    assert found, "docs/performance.md holds the report's tables"
    for block in found:
        path = ROOT / block["path"]
        assert path.parent == ROOT / "benchmarks" / "results" and path.is_file(), path
        expected = render(json.loads(path.read_text()))
        assert block["body"].strip("\n") == expected.strip("\n"), (
            f"regenerate with: python -m benchmarks.report {block['path']}")


def _kind(run: dict) -> str:
    if "meta" in run:
        return "default"
    return "memory" if "baseline_label" in run else "paired"


def test_one_default_run_one_side_by_side_run_and_one_memory_run() -> None:
    assert sorted(_kind(run_of(b)) for b in blocks()) == ["default", "memory", "paired"]


def test_the_run_covers_every_node_and_says_where_it_ran() -> None:
    from testkit.scenarios import NODES

    run = run_of(default_block())
    assert set(run["results"]) == set(NODES)
    meta = run["meta"]
    assert meta["machine"] and meta["date"] and meta["load_before"]
    assert {name: got["interval"] for name, got in meta["nodes"].items()} == \
        {name: node.interval or 1.0 for name, node in NODES.items()}
    # fewer repetitions than the default (to fit a session) only where the page says so
    fewer = [name for name, got in meta["nodes"].items() if got["reps"] < NODES[name].reps]
    assert all(got["reps"] >= 1 for got in meta["nodes"].values())
    if fewer:
        reps = {got["reps"] for got in meta["nodes"].values()}
        assert len(reps) == 1 and f"--reps {reps.pop()}" in DOC.read_text()


def test_no_section_waits_for_a_full_run() -> None:
    assert "not yet from a full run" not in DOC.read_text().lower()


def test_the_block_fails_on_a_changed_figure() -> None:
    """The comparison can fail: one figure changed in a copy of either run no longer matches."""
    for block in blocks():
        run = copy.deepcopy(run_of(block))
        if "meta" in run:
            first = run["results"]["gpus-1"]["otel-gpu"][0]["paced"]
            first["cpu_per_interval_ms"] = first["cpu_per_interval_ms"] * 3 + 1
        elif "baseline_label" in run:
            rss = next(iter(run["results"].values()))["otel-gpu"]["rss_mib"]
            rss[:] = [value * 3 + 1 for value in rss]
        else:
            windows = next(iter(run["results"].values()))["otel-gpu"]
            windows[:] = [value * 3 + 1 for value in windows]
        assert render(run).strip("\n") != block["body"].strip("\n")


def check_medians(text: str) -> int:
    """The medians table: each cell the median of the report's cell for its node, figure
    and system (``-`` where that system has none). Returns how many cells it compared."""
    medians = MEDIANS.search(text)
    assert medians is not None, "docs/performance.md quotes the run's medians per system"
    tables = node_tables(default_block(text)["body"])
    lines = [line for line in medians["body"].splitlines() if line.startswith("|")]
    header = cells(lines[0])[1:]
    assert header == list(COLUMNS)
    rows = [cells(line) for line in lines[2:]]
    assert {row[0] for row in rows} == {"otel-gpu", "handwritten", "nvitop-exporter",
                                        "promclient", "static"}
    for system, *quoted in rows:
        for column, value in zip(header, quoted, strict=True):
            node, label = COLUMNS[column]
            cell = tables[node].get(label, {}).get(system, "-")
            assert value == cell.split(" ")[0], (system, column, value, cell)
    return sum(len(quoted) for _, *quoted in rows)


def check_goals(text: str) -> int:
    """The goals table: every number in its figures column is one the report printed.
    Returns how many numbers it found there."""
    goals = GOALS.search(text)
    assert goals is not None, "docs/performance.md says where the run stands on each goal"
    printed = set(NUMBER.findall("".join(block["body"] for block in blocks(text))))
    rows = [cells(line) for line in goals["body"].splitlines()[2:] if line.startswith("|")]
    assert rows
    for row in rows:
        missing = [n for n in NUMBER.findall(row[1]) if n not in printed]
        assert not missing, (row[0], missing)
    return sum(len(NUMBER.findall(row[1])) for row in rows)


def test_the_medians_quoted_are_the_tables_medians() -> None:
    assert check_medians(DOC.read_text()) >= 10


def test_the_goals_quote_figures_of_the_tables() -> None:
    assert check_goals(DOC.read_text()) >= 5


def test_a_changed_median_or_goal_fails() -> None:
    """Both checks can fail: one figure changed in a copy of the page is caught."""
    text = DOC.read_text()
    medians, goals = MEDIANS.search(text), GOALS.search(text)
    assert medians is not None and goals is not None
    row = next(line for line in medians["body"].splitlines() if line.startswith("| otel-gpu |"))
    changed = row.replace(f"| {cells(row)[1]} |", "| 7.91 |", 1)
    assert changed != row
    with pytest.raises(AssertionError):
        check_medians(text.replace(row, changed))
    line = goals["body"].splitlines()[3]
    figure = NUMBER.findall(cells(line)[1])[0]
    wrong = line.replace(cells(line)[1], cells(line)[1].replace(figure, "9.87", 1))
    with pytest.raises(AssertionError):
        check_goals(text.replace(line, wrong))


def test_the_history_points_at_the_reference() -> None:
    first = HISTORY.read_text().splitlines()[0]
    assert "history" in first and "(performance.md)" in first
    assert "(performance-history.md)" in DOC.read_text()
