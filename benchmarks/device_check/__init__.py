"""The real-GPU check: otel-gpu's every exported value against NVML itself, on one command.

The collector's tests run against the simulator; this check is what earns trust on a
driver no one here wrote. It starts the real ``otel-gpu`` process (``python -m
otel_gpu``) against the real driver, or with ``--simulate PROFILE`` so that CI keeps it
from rotting, and then:

1. **idle**: waits for the first sample (``/metrics`` answers 503 until then: polled
   with a deadline), then, on each fresh sample, reads pynvml right after the scrape and
   compares every exported series of every GPU: exact for what does not move (totals,
   maximum clocks, limits, identity), within a stated tolerance for what does (power,
   temperature, utilisation, clocks; counters such as energy may only have grown, by at
   most a stated rate times the time between the two reads). A value NVML refuses
   (NOT_SUPPORTED and every other error) must be an absent series. A moving value
   outside its tolerance gets a second try on a fresh sample. nvidia-smi ``-q -x`` is
   compared where it reports the same value (skipped, with a note, without
   nvidia-smi). A family exported that the check cannot compare is listed as "not
   compared", with its series count, so coverage is visible.
2. **load** (when torch or cupy imports): a bf16 matmul (fp16 with cupy) holding a few
   GiB, in a child process: everything compared again, GPM activities against pynvml's
   own GPM over a window of the same steady load, utilisation and power seen to move.
3. **pods**: the project's fake kubelet (``testkit.kubelet``: real gRPC on a unix
   socket) gives the GPU to one pod, then to two time-sliced pods; process usage is on,
   with a fake ``/proc`` cgroup tree and kubelet log directories
   (:func:`otel_gpu.sim.node.write_node`) placing the load processes (the simulator's
   processes in simulation) in those pods: pod labels, per-pod memory equal to NVML's
   per-process memory, per-pod energy summing to the GPU's.
4. **latency**: p50/p90 of each NVML function the collector calls (``--latency-calls``
   calls each).
5. **cost**: otel-gpu, nvitop-exporter (when importable) and the hand-written pynvml
   exporters (:mod:`benchmarks.handwritten`: the usual values, and ``handwritten-same``,
   the collector's reads), each under :mod:`benchmarks.launch`, which
   counts NVML calls at the library: CPU per sample and per gzip scrape from ``/proc``,
   RSS, NVML calls per GPU per sample.

It writes ``device-check.json`` and ``device-check.md`` to ``--out`` and exits 1 when a
comparison failed (2 on bad usage). In simulation the check's own pynvml reads go
through the same fake driver in a child process (:mod:`otel_gpu.sim.install`), read at
the sample the scrape shows; ``--reference-scenario`` makes that child read another
scenario, which must fail the check.

    python -m benchmarks.device_check --out DIR [--simulate h100x8]

Its modules, one job each: :mod:`~benchmarks.device_check.specs` (the series compared and
their tolerances, derived from the catalog), :mod:`~benchmarks.device_check.reference` (the
pynvml reads), :mod:`~benchmarks.device_check.reader` (those reads in a child process),
:mod:`~benchmarks.device_check.compare`, :mod:`~benchmarks.device_check.smi`,
:mod:`~benchmarks.device_check.load`, :mod:`~benchmarks.device_check.pods`,
:mod:`~benchmarks.device_check.cost`, :mod:`~benchmarks.device_check.latency`,
:mod:`~benchmarks.device_check.report`, :mod:`~benchmarks.device_check.run` and
:mod:`~benchmarks.device_check.cli`.
"""
