"""The benchmark's tables: each figure's median (min-max) per system, and the ratios.

    python -m benchmarks.report FILE    # the tables of a run written with --json FILE

FILE is a run of ``benchmarks.run``, of ``benchmarks.paired`` or of ``benchmarks.memory``
(every system at once).
docs/performance.md's tables are this command's output for the JSON they name
(benchmarks/tests/test_performance_doc.py holds them to it).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

KINDS = ("otel-gpu", "handwritten", "promclient", "nvitop-exporter", "static")
BASES = ("handwritten", "promclient", "nvitop-exporter", "static")
"""The systems otel-gpu's figures are divided by, one ratio column each."""

FIGURES = (
    ("cached", "p50_ms", "cached scrape p50 (ms)"),
    ("cached", "p99_ms", "cached scrape p99 (ms)"),
    ("cached", "cpu_per_scrape_ms", "server CPU per cached scrape (ms)"),
    ("cycle", "after_sample_p50_ms", "first scrape after a sample, p50 (ms)"),
    ("cycle", "after_sample_p99_ms", "first scrape after a sample, p99 (ms)"),
    ("cycle", "p50_ms", "every scrape while sampling, p50 (ms)"),
    ("cycle", "p99_ms", "every scrape while sampling, p99 (ms)"),
    ("paced", "cpu_per_interval_ms",
     "server CPU per sample interval, one gzip scrape per sample (ms)"),
    ("cycle", "cpu_per_cycle_ms", "server CPU per sample cycle, nobody scraping (ms)"),
    ("cycle_otlp", "cpu_per_cycle_ms",
     "same, with OTLP gRPC pushed every sample interval (ms)"),
    ("cached", "rss_mib", "RSS (MiB)"),
    ("cached", "ready_s", "time to ready (s)"),
    ("cycle", "nvml_library_calls_per_gpu_per_sample",
     "NVML calls per GPU per sample, counted at the library"),
    ("cycle", "nvml_missing_per_gpu_per_sample",
     "same, asked for but not in the simulator (a real driver's extra calls)"),
    ("cycle", "nvml_calls_per_gpu_per_sample",
     "NVML calls per GPU per sample, otel-gpu's own counter"),
    ("cached", "series", "series"),
    ("cached", "body_kb", "body (kB)"),
    ("cached", "gzip_kb", "body as served with gzip (kB)"),
)


def spread(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.3g}"
    return f"{med:.3g} ({min(values):.3g}-{max(values):.3g})"


def medians(runs: list[dict], phase: str, key: str) -> list[float]:
    return [r[phase][key] for r in runs
            if phase in r and key in r[phase] and r[phase][key] == r[phase][key]]


STATIC_STANDS_IN = {"after_sample_p50_ms": "p50_ms", "after_sample_p99_ms": "p99_ms"}
"""The static body has no samples: its every-scrape figure is what it serves after one."""


def heading(name: str, meta: dict | None) -> str:
    """A node's heading: its name, and the repetitions and interval it ran with."""
    node = (meta or {}).get("nodes", {}).get(name)
    if not node:
        return f"### {name}"
    reps = node["reps"]
    return (f"### {name} ({reps} repetition{'s' if reps != 1 else ''}, "
            f"{node['interval']:g} s interval)")


def table(results: dict, meta: dict | None = None) -> str:
    """Markdown: per configuration, each figure's median (min-max) per server, and ratios;
    only the systems the configuration ran, and only the figures one of them has."""
    lines = []
    for name, kinds in results.items():
        ran = [kind for kind in KINDS if kinds.get(kind)]
        bases = [base for base in BASES if base in ran]
        lines += [heading(name, meta), "",
                  "| figure | " + " | ".join(ran) + " | "
                  + " | ".join(f"otel-gpu / {base}" for base in bases) + " |",
                  "|---" * (1 + len(ran) + len(bases)) + "|"]
        for phase, key, label in FIGURES:
            cells, meds = [], {}
            for kind in ran:
                vals = medians(kinds.get(kind, []), phase,
                               STATIC_STANDS_IN.get(key, key) if kind == "static" else key)
                cells.append(spread(vals))
                if vals:
                    meds[kind] = statistics.median(vals)
            if not meds:
                continue
            ratios = []
            for base in bases:
                if "otel-gpu" in meds and meds.get(base):
                    ratios.append(f"{meds['otel-gpu'] / meds[base]:.2f}")
                else:
                    ratios.append("-")
            lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
        lines += ["", targets(kinds), ""]
    return "\n".join(lines)


def document(run: dict) -> str:
    """What docs/performance.md carries of a run: the machine and settings, then the tables."""
    meta = run["meta"]
    settings = ", ".join(f"{key} {value}" for key, value in meta["settings"].items())
    return "\n".join([
        f"Run of {meta['date']} on {meta['machine']} ({meta['wall_s']:.0f} s of wall time; "
        f"load average {meta['load_before']} before, {meta['load_after']} after).",
        f"Settings: {settings}.", "", table(run["results"], meta)]).rstrip("\n") + "\n"


def paired(run: dict) -> str:
    """What docs/performance.md carries of a ``benchmarks.paired`` run: its windows, then
    each system's CPU per sample interval and the first system's over it, window by window."""
    from benchmarks.paired import table as paired_table  # it imports this module

    return (f"Run of {run['date']}: every system at once, {run['windows']} windows of "
            f"{run['seconds']:g} s, each scraped with gzip once per interval.\n\n"
            + paired_table(run["results"]))


def memory(run: dict) -> str:
    """What docs/performance.md carries of a ``benchmarks.memory`` run: its windows and
    baseline, then each system's CPU per sample interval and RSS."""
    from benchmarks.memory import table as memory_table  # it imports this module

    return (f"Run of {run['date']}: every system at once, {run['windows']} windows of "
            f"{run['seconds']:g} s, each scraped with gzip once per interval; "
            f"`otel-gpu@base` is {run['baseline_label'] or 'absent'}.\n\n"
            + memory_table(run["results"]))


def render(run: dict) -> str:
    """The report of any kind of run: side by side (``benchmarks.paired``), memory side by
    side (``benchmarks.memory``) or the default."""
    if "baseline_label" in run:
        return memory(run)
    return paired(run) if "windows" in run else document(run)


def targets(kinds: dict) -> str:
    """The ratios targets 2 and 3 are stated in, from medians."""
    def med(kind: str, phase: str, key: str) -> float | None:
        vals = medians(kinds.get(kind, []), phase, key)
        return statistics.median(vals) if vals else None

    cycle = med("otel-gpu", "cycle", "cpu_per_cycle_ms")
    render = med("promclient", "cached", "cpu_per_scrape_ms")
    with_otlp = med("otel-gpu", "cycle_otlp", "cpu_per_cycle_ms")
    parts = []
    if cycle is not None and render:
        parts.append(f"CPU per cycle over promclient's render (target 2): {cycle / render:.2f}")
    if cycle and with_otlp is not None:
        parts.append(f"CPU OTLP adds per cycle (target 3): {100 * (with_otlp / cycle - 1):+.0f} %")
    paced = med("otel-gpu", "paced", "cpu_per_interval_ms")
    handwritten = med("handwritten", "paced", "cpu_per_interval_ms")
    if paced is not None and handwritten:
        parts.append(f"CPU per sample interval with one gzip scrape, over the hand-written "
                     f"exporter's: {paced / handwritten:.2f}")
    return "; ".join(parts) + "." if parts else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path,
                        help="a run written by benchmarks.run, .paired or .memory --json")
    args = parser.parse_args(argv)
    print(render(json.loads(args.json.read_text())), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
