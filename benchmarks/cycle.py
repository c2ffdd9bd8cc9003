"""Where one cycle's CPU goes at one GPU, in one process: sample, publish, one gzip scrape.

The harness's ``paced`` figure (:mod:`benchmarks.run`) measures a whole process
from outside; this builds the real service (:class:`otel_gpu.wiring.Service`)
on the simulator and runs its cycle by hand, as its threads run it when a
Prometheus scrapes at the sampling interval: ``Sampler.sample`` (the reader
pool's thread included), ``Pipeline.publish_sample`` (the subscribers: the
render on publishing) and the body one gzip scrape is served (``RenderCache.get``).
It prints the process CPU per cycle (median and quartiles of ``--cycles``,
after a warm-up) and, with ``--profile``, cProfile's top functions by
cumulative time (the reader pool's thread is not profiled: its reads show as
the sampler waiting).

    python -m benchmarks.cycle [--configs gpus-1] [--cycles 200] [--profile 30]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from testkit.scenarios import NODES, node_list, write_scenario


@contextlib.contextmanager
def built(name: str) -> Iterator[tuple[Any, Callable[[], None]]]:
    """The real service on node ``name``'s simulator, and its cycle as its threads run it
    when a Prometheus scrapes at the sampling interval; stopped afterwards."""
    from otel_gpu import sim
    from otel_gpu.config import load
    from otel_gpu.sample.library import Nvml
    from otel_gpu.wiring import Service

    with tempfile.TemporaryDirectory(prefix="otel-gpu-cycle-") as tmp:
        scenario = write_scenario(NODES[name], Path(tmp))
        sim.install(sim.FakeNvml(sim.load_scenario(str(scenario))))
        config = load({"listen": "127.0.0.1:0", "interval": "1s",
                       "kubelet_socket": str(Path(tmp) / "none.sock")}, environ={})
        service = Service(config, Nvml(), environ={})
    cache = service.server.cache
    assert cache is not None
    try:
        service.nvml.init()

        def cycle() -> None:
            service.pipeline.publish_sample(service.sampler.sample())
            service.pipeline.run_followups()
            cache.get()  # type: ignore[union-attr]

        yield service, cycle
    finally:
        service.server.server_close()
        service.telemetry.shutdown(0.5)
        service.sampler.close()
        service.nvml.shutdown()
        sim.uninstall()


def run(name: str, cycles: int, profile: int) -> list[float]:
    """CPU milliseconds of each of ``cycles`` cycles of the service on node ``name``."""
    with built(name) as (_, cycle):
        for _ in range(5):  # warm-up: discovery, the first render, caches
            cycle()
        times = []
        profiler = cProfile.Profile() if profile else None
        for _ in range(cycles):
            start = time.process_time()
            if profiler is not None:
                profiler.enable()
            cycle()
            if profiler is not None:
                profiler.disable()
            times.append(1000 * (time.process_time() - start))
        if profiler is not None:
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(profile)
            stats.sort_stats("tottime").print_stats(profile)
        return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=node_list, default="gpus-1")
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the cycles and print the top N functions")
    args = parser.parse_args(argv)
    if args.cycles < 3:
        parser.error("--cycles must be 3 or more")
    for name in args.configs:
        times = run(name, args.cycles, args.profile)
        q = statistics.quantiles(times, n=4)
        print(f"{name}: CPU per cycle {statistics.median(times):.2f} ms "
              f"(IQR {q[0]:.2f}-{q[2]:.2f}) over {len(times)} cycles")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
