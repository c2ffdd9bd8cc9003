"""CPU per sample interval of several systems running at the same time: ratios a noisy
machine does not move.

:mod:`benchmarks.run` runs one system at a time; on a shared virtual machine the same
system's CPU then moves by up to 2.5x between two runs a minute apart (the host's
other guests, the clock), and a ratio of two medians taken minutes apart carries that
noise. Here every system named runs at once, on the same node of the simulator, each
scraped with gzip once per interval by its own client (the harness's *paced* phase);
each window reads every process's CPU clock over the same seconds, so a slow second
slows all of them alike. Each window gives each system's CPU per interval and its
the first system's over it; the report is the median of the windows' ratios with
their spread. The systems use a fraction of a core each, so they barely compete.

    python -m benchmarks.paired [--configs gpus-1] [--systems otel-gpu,handwritten-same,handwritten]
                                [--windows 10] [--seconds 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.report import spread
from benchmarks.run import Bench, Paced, Settings, window_cpu, window_seconds
from testkit.scenarios import NODES, SAMPLING, node_list


def measure(name: str, systems: list[str], windows: int, seconds: float,
            interval: float = 1.0) -> dict[str, list[float]]:
    """Each system's CPU per interval (ms) in each window, all run at once on node ``name``."""
    node = NODES[name]
    with tempfile.TemporaryDirectory(prefix="otel-gpu-paired-") as tmp:
        bench = Bench(Path(tmp), Settings(interval=interval))
        servers = []
        try:
            for system in systems:
                servers.append(bench.start(system, node, interval)[0])
            warm = 3 * interval  # the first samples, and rendering turned on
            until = time.monotonic() + warm + windows * seconds + interval
            clients = [Paced(s.port, interval, until) for s in servers]  # type: ignore[arg-type]
            threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
            for thread in threads:
                thread.start()
            time.sleep(warm)
            out: dict[str, list[float]] = {system: [] for system in systems}
            for _ in range(windows):
                marks = [window_cpu(s.proc.pid) for s in servers]
                started = time.monotonic()
                time.sleep(seconds)
                cpu = [window_seconds(s.proc.pid, m) for s, m in zip(servers, marks, strict=True)]
                took = time.monotonic() - started
                for system, used in zip(systems, cpu, strict=True):
                    out[system].append(1000 * used / took * interval)
            for thread in threads:
                thread.join()
            errors = {system: c.errors for system, c in zip(systems, clients, strict=True)
                      if c.errors or not c.scrapes}
            if errors:
                raise RuntimeError(f"scrapes failed or never answered: {errors}")
        finally:
            for server in servers:
                server.stop()
            bench.close()
    return out


def table(results: dict[str, dict[str, list[float]]]) -> str:
    """Markdown: per node, each system's CPU per interval and the first system's over it,
    median (min-max) over the windows, the ratio taken window by window."""
    lines = ["| node | system | CPU per sample interval (ms) | the first over it, per window |",
             "|---|---|---|---|"]
    for name, by_system in results.items():
        first = next(iter(by_system.values()))
        for system, values in by_system.items():
            ratios = [f / v for v, f in zip(values, first, strict=True) if v]
            lines.append(f"| {name} | {system} | {spread(values)} | "
                         f"{spread(ratios) if system != next(iter(by_system)) else '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=node_list, default="gpus-1")
    parser.add_argument("--systems", default="otel-gpu,handwritten-same,handwritten",
                        help=f"comma-separated, of {', '.join(SAMPLING)}; the ratios are the "
                             "first's over each")
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of a window")
    parser.add_argument("--json", type=Path, help="write every window's figures here")
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SAMPLING]
    if unknown or len(systems) < 2:
        parser.error(f"two or more systems of {', '.join(SAMPLING)}; not: "
                     f"{', '.join(unknown) or '(fewer than two)'}")
    if args.windows < 1 or not 0 < args.seconds <= 120:
        parser.error("--windows must be 1 or more and --seconds in (0, 120]")
    results = {name: measure(name, systems, args.windows, args.seconds) for name in args.configs}
    text = table(results)
    print(text, end="")
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"),
                                         "windows": args.windows, "seconds": args.seconds,
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
