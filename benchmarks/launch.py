"""Server processes that count their NVML calls where they reach the (fake) library.

Each subcommand puts the simulator's driver under pynvml inside its own
process, runs a real exporter in-process on it, and counts every call that
reaches the driver's C symbols, so that calls per GPU per sample are counted
the same way for every system, not read from an exporter's own self-metric:

- ``otel-gpu``: ``otel_gpu.cli.main`` with the arguments after ``--`` (which
  include ``--simulate``); its driver is swapped for a counting one of the
  same class, and a sample begins at each ``Sampler.sample``;
- ``nvitop-exporter``: nvitop-exporter 1.7.2's own entry point
  (``nvitop_exporter.cli.main``) after the simulator is installed, before
  nvitop is imported and initialises NVML; a sample begins at each
  ``PrometheusExporter.update_host`` (the first step of its update loop). It
  listens on a port the kernel picks, written to ``--port-file``.

The counts are snapshotted at the start of each sample (so two snapshots
always delimit whole cycles, whenever the harness reads them) and served as
one JSON object per connection on a loopback port written to
``--counts-file``: ``samples``, ``calls`` (per symbol, at the last sample's
start), ``missing`` (symbols asked for that the fake does not implement:
on a real driver each would be one more call) and ``modules`` (the top-level
modules imported, for the check that the collector runs as shipped:
:func:`as_shipped`). The server's accept loop
blocks, so it costs nothing between reads.

    python -m benchmarks.launch otel-gpu --counts-file F -- --simulate S ...
    python -m benchmarks.launch nvitop-exporter --scenario S --port-file F \\
        --counts-file F --interval 1
    python -m benchmarks.launch handwritten --scenario S --port-file F --counts-file F

``--real`` in place of ``--simulate``/``--scenario`` counts the calls reaching the real
libnvidia-ml instead (:class:`CountingLibrary`), for the real-GPU check
(:mod:`benchmarks.device_check`).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.baselines import announce
from otel_gpu import sim
from otel_gpu.sim.scenario import Scenario

NVITOP = "nvitop-exporter"
NVITOP_HOSTNAME = "bench"
"""The ``--hostname`` label nvitop-exporter is given (its default probes the network)."""


class CountingNvml(sim.FakeNvml):
    """The simulator's driver, also counting the symbols pynvml asks for and it lacks."""

    def __init__(self, scenario: Scenario) -> None:
        self.missing: collections.Counter[str] = collections.Counter()
        super().__init__(scenario)

    def __getattr__(self, name: str) -> Any:
        # reached only when the normal lookup fails: pynvml then raises FunctionNotFound
        if name.startswith("nvml"):
            self.__dict__["missing"][name] += 1
        raise AttributeError(name)


class _CountedSymbol:
    """One C function of the real library: counts each call, forwards ``restype`` and
    ``argtypes`` (pynvml sets them on some pointers) to the real one."""

    def __init__(self, counter: collections.Counter[str], name: str, real: Any) -> None:
        self.__dict__.update(_counter=counter, _name=name, _real=real)

    def __call__(self, *args: Any) -> Any:
        self._counter[self._name] += 1
        return self._real(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._real, name, value)


class CountingLibrary:
    """The real libnvidia-ml under pynvml, counting every call to each C symbol: the same
    counts :class:`CountingNvml` gives on the simulator, on a real driver."""

    def __init__(self, real: Any) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.missing: collections.Counter[str] = collections.Counter()
        self._real = real

    def __getattr__(self, name: str) -> Any:
        try:
            real = getattr(self.__dict__["_real"], name)
        except AttributeError:
            if name.startswith("nvml"):
                self.__dict__["missing"][name] += 1
            raise
        return _CountedSymbol(self.__dict__["calls"], name, real)


def install_counting_library() -> CountingLibrary:
    """Load the real library into pynvml (as its first call would) and put a counting
    proxy in its place; raises pynvml's NVMLError when there is no driver."""
    import pynvml

    pynvml._LoadNvmlLibrary()
    with pynvml.libLoadLock:
        lib = CountingLibrary(pynvml.nvmlLib)
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return lib


class Counts:
    """The driver's per-symbol counts at the start of the latest sample."""

    def __init__(self) -> None:
        self.fake: CountingNvml | None = None
        self._lock = threading.Lock()
        self._samples = 0
        self._calls: dict[str, int] = {}
        self._missing: dict[str, int] = {}

    def mark(self) -> None:
        """A sample begins: what the driver has seen so far belongs to the samples before."""
        fake = self.fake
        calls = dict(fake.calls) if fake is not None else {}
        missing = dict(fake.missing) if fake is not None else {}
        with self._lock:
            self._samples += 1
            self._calls, self._missing = calls, missing

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {"samples": self._samples, "calls": self._calls, "missing": self._missing,
                    "modules": sorted({name.partition(".")[0] for name, module
                                       in list(sys.modules.items()) if module is not None})}


def serve_counts(counts: Counts, counts_file: Path) -> None:
    """Answer each connection on a loopback port with the counts as JSON, then close it."""
    server = socket.create_server(("127.0.0.1", 0))
    announce(counts_file, server.getsockname()[1])

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(json.dumps(counts.snapshot()).encode())

    threading.Thread(target=loop, daemon=True, name="bench-nvml-counts").start()


def counting_driver(counts: Counts) -> Callable[[Scenario], CountingNvml]:
    """A stand-in for ``sim.FakeNvml`` that hands the driver it builds to ``counts``."""
    def build(scenario: Scenario) -> CountingNvml:
        counts.fake = CountingNvml(scenario)
        return counts.fake
    return build


def marking(counts: Counts, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, marking the start of a sample first."""
    def marked(self: object, *args: object, **kwargs: object) -> Any:
        counts.mark()
        return method(self, *args, **kwargs)
    return marked


NOT_SHIPPED = ("psutil",)
"""Installed beside the benchmark for a comparator (nvitop-exporter needs psutil) but in no
install of otel-gpu (not a dependency, not in the image's lock). The OpenTelemetry SDK
imports psutil whenever it is there (about 0.8 MiB of RSS), so the collector measured
here is kept from it: the one measured is the one shipped
(``benchmarks/tests/test_launch.py`` holds a run's imports to the lock)."""


def as_shipped() -> None:
    """Make each of :data:`NOT_SHIPPED` fail to import in this process, as where it is not
    installed (before anything that would import it)."""
    for name in NOT_SHIPPED:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]


def run_otel_gpu(argv: list[str], counts_file: Path, real: bool = False) -> int:
    as_shipped()
    from otel_gpu import cli
    from otel_gpu.sample.sampler import Sampler

    counts = Counts()
    serve_counts(counts, counts_file)
    if real:
        counts.fake = install_counting_library()  # type: ignore[assignment]
    else:
        sim.FakeNvml = counting_driver(counts)  # type: ignore[assignment, misc]
    Sampler.sample = marking(counts, Sampler.sample)  # type: ignore[method-assign]
    return cli.main(argv)


def _counted_driver(counts: Counts, scenario: Path | None) -> None:
    """The simulator's driver for ``scenario`` under pynvml, or the real library (None),
    counted into ``counts``; before the exporter imports pynvml's users."""
    if scenario is None:
        counts.fake = install_counting_library()  # type: ignore[assignment]
    else:
        counts.fake = CountingNvml(sim.load_scenario(str(scenario)))
        sim.install(counts.fake)


def run_handwritten(scenario: Path | None, port_file: Path, counts_file: Path,
                    interval: float, same: bool = False) -> int:
    from benchmarks import handwritten
    from benchmarks.baselines import announce as write_port

    counts = Counts()
    _counted_driver(counts, scenario)
    serve_counts(counts, counts_file)
    exporter = handwritten.SameReads if same else handwritten.Exporter
    exporter.sample = marking(counts, exporter.sample)  # type: ignore[method-assign]
    return handwritten.serve(interval, lambda port: write_port(port_file, port), same=same)


def run_nvitop(scenario: Path | None, port_file: Path, counts_file: Path,
               interval: float) -> int:
    counts = Counts()
    _counted_driver(counts, scenario)  # before nvitop is imported: it must find it in pynvml
    serve_counts(counts, counts_file)

    from nvitop_exporter import cli  # type: ignore[import-untyped]
    from nvitop_exporter.exporter import PrometheusExporter  # type: ignore[import-untyped]

    PrometheusExporter.update_host = marking(counts, PrometheusExporter.update_host)
    start = cli.start_wsgi_server

    def start_and_announce(*args: Any, **kwargs: Any) -> Any:
        server, thread = start(*args, **kwargs)
        announce(port_file, server.server_port)
        return server, thread

    cli.start_wsgi_server = start_and_announce
    sys.argv = ["nvitop-exporter", "--hostname", NVITOP_HOSTNAME, "--bind-address", "127.0.0.1",
                "--port", "0", "--interval", f"{interval:g}"]
    return int(cli.main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="system", required=True)
    ours = sub.add_parser("otel-gpu", help="otel-gpu, arguments after --")
    ours.add_argument("--counts-file", type=Path, required=True)
    ours.add_argument("--real", action="store_true", help="count calls to the real library")
    ours.add_argument("rest", nargs=argparse.REMAINDER)
    for name, what in ((NVITOP, "nvitop-exporter"), ("handwritten", "the pynvml baseline"),
                       ("handwritten-same", "the pynvml baseline reading what otel-gpu reads")):
        peer = sub.add_parser(name, help=f"{what} on the simulator, or the real driver")
        where = peer.add_mutually_exclusive_group(required=True)
        where.add_argument("--scenario", type=Path)
        where.add_argument("--real", action="store_true")
        peer.add_argument("--port-file", type=Path, required=True)
        peer.add_argument("--counts-file", type=Path, required=True)
        peer.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.system == "otel-gpu":
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        return run_otel_gpu(rest, args.counts_file, args.real)
    if args.system in ("handwritten", "handwritten-same"):
        return run_handwritten(args.scenario, args.port_file, args.counts_file, args.interval,
                               same=args.system == "handwritten-same")
    if importlib.util.find_spec("nvitop_exporter") is None:  # found, not imported: see above
        print("nvitop-exporter is not installed: pip install 'nvitop-exporter==1.7.2' "
              "(the project's [bench] extra)", file=sys.stderr)
        return 2
    return run_nvitop(args.scenario, args.port_file, args.counts_file, args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
