"""Instructions per cycle, counted by valgrind: a figure a noisy machine cannot move.

On a shared virtual machine the CPU time of the same cycle varies by 1.7x from one
run to the next (the clock, the neighbours), which hides a change of 10 or 20 %.
``valgrind --tool=callgrind`` counts the instructions a process executes instead:
the same code on the same input counts the same to within about 1 %, whatever
else the machine does. This runs a child under it twice, once building the
system and running no cycle, once running ``--cycles`` more, and divides the
difference, so that start-up and imports cancel out. Hot cycles, back to back:
the in-process counterpart of the harness's paced figure, not a replacement.

Systems (``--systems``):

- ``otel-gpu``: :mod:`benchmarks.cycle`'s cycle of the real service (sample,
  publication with its render, one gzip scrape's body);
- ``handwritten``: :mod:`benchmarks.handwritten`'s sample, then its
  prometheus_client body and its gzip, as one request pays it;
- ``handwritten-same``: the same for its :class:`~benchmarks.handwritten.SameReads`,
  which makes otel-gpu's NVML calls;
- ``sample`` and ``collection``: otel-gpu's sample alone, and its collection alone
  (on the last sample);
- ``field-batch``: one ``nvmlDeviceGetFieldValues`` with the fields and link states
  the collector asks a GPU for, through pynvml and the simulator's driver (on a real
  driver the simulator's part is the driver's own).

    python -m benchmarks.instructions [--configs gpus-1] [--cycles 100] [--systems ...]

Needs valgrind (Debian's ``valgrind``); about 25 s per system and node on a 2-core
machine at the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.cycle import built
from testkit.scenarios import NODES, node_list, write_scenario

SYSTEMS = ("otel-gpu", "handwritten", "handwritten-same", "sample", "collection",
           "field-batch")
_COLLECTED = re.compile(r"Collected : (\d+)")


@contextlib.contextmanager
def _handwritten(name: str, same: bool) -> Iterator[Callable[[], object]]:
    from prometheus_client import REGISTRY, generate_latest

    from benchmarks.handwritten import Exporter, SameReads
    from otel_gpu import sim

    with tempfile.TemporaryDirectory(prefix="otel-gpu-instructions-") as tmp:
        scenario = write_scenario(NODES[name], Path(tmp))
        sim.install(sim.FakeNvml(sim.load_scenario(str(scenario))))
        try:
            exporter = SameReads() if same else Exporter()
        except BaseException:
            sim.uninstall()
            raise
        try:
            def cycle() -> object:
                exporter.sample()
                return gzip.compress(generate_latest(REGISTRY))

            yield cycle
        finally:
            exporter.nvml.nvmlShutdown()
            sim.uninstall()


@contextlib.contextmanager
def _system(system: str, name: str) -> Iterator[Callable[[], object]]:
    """The function one cycle of ``system`` on node ``name`` is, warmed up."""
    if system in ("handwritten", "handwritten-same"):
        with _handwritten(name, same=system == "handwritten-same") as cycle:
            for _ in range(5):
                cycle()
            yield cycle
        return
    with built(name) as (service, cycle):
        for _ in range(5):  # discovery, the first render, caches
            cycle()
        if system == "otel-gpu":
            yield cycle
        elif system == "sample":
            yield service.sampler.sample
        elif system == "collection":
            yield service.telemetry.collect
        else:  # field-batch: the call the last sample made, asked again as it was
            module = service.nvml.module
            real = module.nvmlDeviceGetFieldValues
            asked: list[tuple[object, list]] = []

            def spy(handle: object, ids: list) -> object:
                asked.append((handle, list(ids)))
                return real(handle, ids)

            module.nvmlDeviceGetFieldValues = spy
            try:
                service.sampler.sample()
            finally:
                module.nvmlDeviceGetFieldValues = real
            if not asked:
                raise SystemExit("field-batch: the sample made no batched field call")
            handle, ids = asked[-1]
            yield lambda: real(handle, ids)


def run_cycles(system: str, name: str, cycles: int) -> int:
    """Build ``system`` on ``name`` and run ``cycles`` of it (the child's whole work)."""
    with _system(system, name) as cycle:
        for _ in range(cycles):
            cycle()
    return cycles


def count(system: str, name: str, cycles: int, valgrind: str) -> int:
    """Instructions the child executes building ``system`` and running ``cycles``."""
    argv = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, "-m", "benchmarks.instructions", "--child", system,
            "--configs", name, "--cycles", str(cycles)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in both runs
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900,
                          check=False, cwd=Path(__file__).resolve().parent.parent)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"{system} on {name} under valgrind failed (exit "
                         f"{done.returncode}): {' / '.join(tail)}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=node_list, default="gpus-1")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--systems",
                        default="otel-gpu,handwritten,handwritten-same,sample,collection",
                        help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # the runs under valgrind: the first with no cycle at all
        for name in args.configs:
            run_cycles(args.child, name, args.cycles)
        return 0
    if args.cycles < 1:
        parser.error("--cycles must be 1 or more")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        parser.error(f"unknown system(s): {', '.join(unknown) or '(none)'}; "
                     f"known: {', '.join(SYSTEMS)}")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    print("| node | system | instructions per cycle (millions) |")
    print("|---|---|---|")
    for name in args.configs:
        for system in systems:
            base = count(system, name, 0, valgrind)
            more = count(system, name, args.cycles, valgrind)
            print(f"| {name} | {system} | {(more - base) / args.cycles / 1e6:.2f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
