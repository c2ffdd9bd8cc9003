"""benchmarks.memory: its table's ratios, and its refusal of a baseline that is no tree."""

from __future__ import annotations

import pytest

from benchmarks import memory
from benchmarks.baselines import PROMCLIENT_KUBELET


def test_the_table_takes_cpu_ratios_window_by_window_and_rss_over_promclient():
    results = {"gpus-8": {
        "otel-gpu": {"cpu_ms": [10.0, 20.0], "rss_mib": [40.0, 42.0], "peak_mib": 43.0},
        memory.BASE: {"cpu_ms": [20.0, 20.0], "rss_mib": [60.0, 60.0], "peak_mib": 61.0},
        "promclient": {"cpu_ms": [30.0, 40.0], "rss_mib": [20.0, 20.0], "peak_mib": 21.0}}}
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:-1]]
            for line in memory.table(results).splitlines()[2:]}
    assert rows["otel-gpu"] == ["15 (10-20)", "-", "41 (40-42)", "43.0", "2.05", "-"]
    assert rows[memory.BASE][1] == "1.5 (1-2)"  # 2.0 and 1.0, not 20 / 15
    assert rows["promclient"][1:] == ["2.5 (2-3)", "20 (20-20)", "21.0", "1.00", "-"]


def test_on_a_node_with_pods_rss_is_also_held_against_the_baseline_asking_the_kubelet():
    results = {"pods-500": {
        "otel-gpu": {"cpu_ms": [10.0], "rss_mib": [60.0], "peak_mib": 61.0},
        "promclient": {"cpu_ms": [20.0], "rss_mib": [30.0], "peak_mib": 31.0},
        PROMCLIENT_KUBELET: {"cpu_ms": [21.0], "rss_mib": [48.0], "peak_mib": 49.0}}}
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:-1]]
            for line in memory.table(results).splitlines()[2:]}
    assert rows["otel-gpu"][4:] == ["2.00", "1.25"]
    assert rows[PROMCLIENT_KUBELET][4:] == ["1.60", "1.00"]


def test_a_baseline_without_the_collector_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        memory.main(["--baseline", str(tmp_path)])
    assert "no otel_gpu/ there" in capsys.readouterr().err
