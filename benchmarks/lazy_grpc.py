"""RSS and time to ready with gRPC imported or not (target 5 of docs/performance.md).

The collector runs with pod attribution on (the default) at 8 GPUs, twice per
repetition, interleaved: with a kubelet socket path where nothing exists (gRPC
is never imported), and with a fake kubelet serving there without pods (the
client is built on the first look that finds the socket, so gRPC and the
kubelet stubs are imported and it polls).

    python -m benchmarks.lazy_grpc [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.run import Server, rss_mib, spread
from testkit.kubelet import FakeKubelet
from testkit.scenarios import NODES, write_scenario


def measure(scenario: Path, socket: Path) -> tuple[float, float]:
    server = Server([sys.executable, "-m", "otel_gpu", "--simulate", str(scenario), "--listen",
                     "127.0.0.1:0", "--interval", "1h", "--kubelet-socket", str(socket),
                     "--kubelet-interval", "1s"])
    try:
        ready = server.wait_ready("/readyz")
        time.sleep(1.5)  # the watcher, when built, has polled by now
        return ready, rss_mib(server.proc.pid)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        scenario = write_scenario(NODES["gpus-8"], Path(tmp))
        absent, present = Path(tmp) / "absent.sock", Path(tmp) / "kubelet.sock"
        kubelet = FakeKubelet(str(present)).start()
        got: dict[str, list[tuple[float, float]]] = {"no socket": [], "gRPC imported": []}
        try:
            for rep in range(args.reps):
                order = [("no socket", absent), ("gRPC imported", present)]
                for name, path in order if rep % 2 == 0 else order[::-1]:
                    got[name].append(measure(scenario, path))
        finally:
            kubelet.stop()
    print("| collector, 8 GPUs | time to ready (s) | RSS (MiB) |\n|---|---|---|")
    for name, rows in got.items():
        print(f"| {name} | {spread([r[0] for r in rows])} | {spread([r[1] for r in rows])} |")
    ratio = statistics.median(r[1] for r in got["gRPC imported"]) / statistics.median(
        r[1] for r in got["no socket"])
    print(f"\nRSS ratio, gRPC imported / not: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
