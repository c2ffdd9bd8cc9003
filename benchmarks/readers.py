"""What the reader threads cost: one sample's CPU with the pool, a thread per GPU, or none.

Each layout gets its own :class:`~otel_gpu.sample.sampler.Sampler` over the same
fake driver in this one process, and the samples are interleaved in an order
that rotates every round, so the machine's drift is shared by all three:

- ``pool``: the collector's reader pool (one thread while no GPU hangs);
- ``per-gpu``: a pool as large as the node, one thread per GPU as the
  collector had before (every GPU's job woken on its own thread);
- ``inline``: every GPU read on the sampler thread, the floor (it gives up
  what the threads are for: a hung call would stall the whole sample).

Printed: the median process CPU per sample with its interquartile range, and
each median as a ratio of the per-GPU layout's, as a Markdown table row.

    python -m benchmarks.readers [--configs gpus-8,gpus-64] [--rounds 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from testkit.scenarios import node_list, simulated_nvml

LAYOUTS = ("pool", "per-gpu", "inline")


def measure(node_name: str, rounds: int) -> dict[str, list[float]]:
    from otel_gpu import sim
    from otel_gpu.instrument.catalog import all_sources
    from otel_gpu.sample.sampler import Sampler
    from otel_gpu.sample.workers import DeviceWorker, Workers

    class Inline(Workers):
        def run(self, jobs: Mapping[int, Callable[[DeviceWorker], Any]], timeout: float,
                errors: dict[int, BaseException] | None = None) -> dict[int, Any]:
            return {index: job(self.get(index)) for index, job in jobs.items()}

    nvml = simulated_nvml(node_name)
    gpus = nvml.module.nvmlDeviceGetCount()
    layouts = {"pool": Workers(time.monotonic), "per-gpu": Workers(time.monotonic, gpus),
               "inline": Inline(time.monotonic)}
    samplers = {name: Sampler(nvml, all_sources(), read_timeout=10.0, workers=workers)
                for name, workers in layouts.items()}
    cpu: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    try:
        for sampler in samplers.values():
            sampler.sample()  # discovery and the first GPM interval, not measured
        for i in range(rounds):
            order = LAYOUTS[i % 3:] + LAYOUTS[:i % 3]
            for name in order:
                start = time.process_time()
                samplers[name].sample()
                cpu[name].append(1000 * (time.process_time() - start))
        return cpu
    finally:
        for sampler in samplers.values():
            sampler.close()
        nvml.shutdown()
        sim.uninstall()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=node_list, default="gpus-8,gpus-64")
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args(argv)
    if not 3 <= args.rounds <= 10_000:
        parser.error("--rounds must be 3 to 10000")
    print("| node | " + " | ".join(f"{n} ms (IQR)" for n in LAYOUTS)
          + " | pool / per-gpu | inline / per-gpu |")
    print("|---" * (len(LAYOUTS) + 3) + "|")
    for name in args.configs:
        cpu = measure(name, args.rounds)
        med = {n: statistics.median(v) for n, v in cpu.items()}
        cells = []
        for n in LAYOUTS:
            q = statistics.quantiles(cpu[n], n=4)
            cells.append(f"{med[n]:.1f} ({q[0]:.1f}-{q[2]:.1f})")
        print(f"| {name} | " + " | ".join(cells)
              + f" | {med['pool'] / med['per-gpu']:.2f} | {med['inline'] / med['per-gpu']:.2f} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
