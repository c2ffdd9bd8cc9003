"""Resident memory and CPU per sample, side by side: the collector, the collector of
another checkout, and a prometheus_client exporter holding the same series.

On a node with pods the prometheus_client exporter also runs asking the fake
kubelet for its pods through gRPC (``promclient+kubelet``), as an exporter putting
pods on its series must: the collector's RSS is held against that one there.

Every system named runs at once on the same node of the simulator, each scraped
with gzip once per interval by its own client (the harness's *paced* phase).
CPU is read over the same windows for all (so a slow second slows all alike),
as :mod:`benchmarks.paired` does; RSS (VmRSS) is read at the end of every window
and reported as its median and its largest, beside the peak (VmHWM).
``--baseline DIR`` adds the collector run from another source tree (a
``git worktree`` of an earlier commit) under the name ``otel-gpu@base``.

    python -m benchmarks.memory [--configs gpus-8,gpus-64,gpus-256] [--baseline DIR]
                                [--windows 5] [--seconds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.baselines import PROMCLIENT_KUBELET
from benchmarks.report import spread
from benchmarks.run import ROOT, Bench, Paced, Settings, window_cpu, window_seconds
from testkit.scenarios import NODES, node_list

BASE = "otel-gpu@base"


def _status_mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(name: str, baseline: Path | None, windows: int, seconds: float) -> dict[str, dict]:
    """Each system's CPU per interval (ms) and RSS (MiB) per window, and its peak RSS."""
    node = NODES[name]
    interval = node.interval or 1.0
    with tempfile.TemporaryDirectory(prefix="otel-gpu-memory-") as tmp:
        bench = Bench(Path(tmp), Settings(interval=interval))
        servers = {}
        try:
            bench.capture(node)  # the body promclient replays
            servers["otel-gpu"] = bench.start("otel-gpu", node, interval)[0]
            if baseline is not None:
                servers[BASE] = bench.start("otel-gpu", node, interval, root=baseline)[0]
            servers["promclient"] = bench.start("promclient", node, interval)[0]
            if node.pods:
                servers[PROMCLIENT_KUBELET] = bench.start(PROMCLIENT_KUBELET, node,
                                                          interval)[0]
            warm = 3 * interval  # the first samples, and rendering turned on
            until = time.monotonic() + warm + windows * seconds + interval
            clients = {k: Paced(s.port, interval, until)  # type: ignore[arg-type]
                       for k, s in servers.items()}
            threads = [threading.Thread(target=c.run, daemon=True) for c in clients.values()]
            for thread in threads:
                thread.start()
            time.sleep(warm)
            out: dict[str, dict] = {k: {"cpu_ms": [], "rss_mib": []} for k in servers}
            for _ in range(windows):
                marks = {k: window_cpu(s.proc.pid) for k, s in servers.items()}
                started = time.monotonic()
                time.sleep(seconds)
                took = time.monotonic() - started
                for k, s in servers.items():
                    used = window_seconds(s.proc.pid, marks[k])
                    out[k]["cpu_ms"].append(1000 * used / took * interval)
                    out[k]["rss_mib"].append(_status_mib(s.proc.pid, "VmRSS"))
            for k, s in servers.items():
                out[k]["peak_mib"] = _status_mib(s.proc.pid, "VmHWM")
            for thread in threads:
                thread.join()
            failed = {k: c.errors for k, c in clients.items() if c.errors or not c.scrapes}
            if failed:
                raise RuntimeError(f"scrapes failed or never answered: {failed}")
            return out
        finally:
            for server in servers.values():
                server.stop()
            bench.close()


def table(results: dict[str, dict[str, dict]]) -> str:
    """Markdown: per node and system, CPU per interval and RSS, median (min-max) over the
    windows, CPU over the collector's taken window by window, and RSS over promclient's
    and, on a node with pods, over promclient+kubelet's."""
    lines = ["| node | system | CPU per sample interval (ms) | CPU over otel-gpu's, per window "
             "| RSS (MiB) | peak RSS (MiB) | RSS over promclient "
             "| RSS over promclient+kubelet |",
             "|---|---|---|---|---|---|---|---|"]
    for name, by_system in results.items():
        ref = statistics.median(by_system["promclient"]["rss_mib"])
        asking = by_system.get(PROMCLIENT_KUBELET)
        ref_asking = statistics.median(asking["rss_mib"]) if asking else None
        own = by_system["otel-gpu"]["cpu_ms"]
        for system, got in by_system.items():
            rss = statistics.median(got["rss_mib"])
            ratios = [v / o for v, o in zip(got["cpu_ms"], own, strict=True) if o]
            over = spread(ratios) if system != "otel-gpu" else "-"
            over_asking = f"{rss / ref_asking:.2f}" if ref_asking else "-"
            lines.append(f"| {name} | {system} | {spread(got['cpu_ms'])} | {over} | "
                         f"{spread(got['rss_mib'])} | {got['peak_mib']:.1f} | {rss / ref:.2f} "
                         f"| {over_asking} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=node_list, default="gpus-8,gpus-64,gpus-256")
    parser.add_argument("--baseline", type=Path, help="another checkout's source tree")
    parser.add_argument("--baseline-label", default="",
                        help="what the baseline is, for the report (its commit and changes)")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of a window")
    parser.add_argument("--json", type=Path, help="write every window's figures here")
    args = parser.parse_args(argv)
    if args.baseline is not None and not (args.baseline / "otel_gpu").is_dir():
        parser.error(f"--baseline {args.baseline}: no otel_gpu/ there")
    if args.baseline is not None and args.baseline.resolve() == ROOT.resolve():
        parser.error("--baseline is this tree")
    if args.windows < 1 or not 0 < args.seconds <= 120:
        parser.error("--windows must be 1 or more and --seconds in (0, 120]")
    results = {name: measure(name, args.baseline, args.windows, args.seconds)
               for name in args.configs}
    text = table(results)
    print(text, end="")
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"),
                                         "windows": args.windows, "seconds": args.seconds,
                                         "baseline_label": args.baseline_label,
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
