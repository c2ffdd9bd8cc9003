"""Where a cycle's CPU goes, in one process: sample, SDK collection, text, gzip, OTLP.

The harness (:mod:`benchmarks.run`) sees a whole process from outside; this
runs the collector's stages in-process on the same scenarios and times each
with the process's CPU clock (median of ``--repeat`` rounds after one warm-up),
beside the prometheus_client render of the same series:

- ``sample``: one NVML sample on the fake driver (``Sampler.sample``);
- ``collect``: one SDK collection (every instrument callback) through the
  collector's :class:`~otel_gpu.export.collected.CollectingReader`;
- ``write``: that collection as Prometheus text (:class:`TextWriter`), and
  ``write_exporter``: the same through OpenTelemetry's Prometheus exporter
  and prometheus_client, as the collector wrote it before;
- ``gzip``: the body at level 5, as the render cache stores it;
- ``otlp``: the pod regrouping and OTLP encoding of one push with the cached
  encoder, and ``otlp_sdk``: with the SDK's encoder;
- ``promclient``: prometheus_client's ``generate_latest`` and gzip of a
  registry holding the same series (what the baseline does per scrape).

    python -m benchmarks.render [--configs gpus-8,gpus-64] [--repeat 10]

``--formats`` measures the negotiated exposition formats instead (:func:`formats`): for
each, the CPU of writing one publication's body in it and of its gzip (once per
publication, when first asked for), and of a scrape served from the cache (the
negotiation of a real Prometheus Accept header and the look-up), rounds interleaved
across the formats, medians.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import time
from collections.abc import Callable

from benchmarks.baselines import series_file
from testkit.scenarios import node_list, simulated_nvml

STAGES = ("sample", "collect", "write", "write_exporter", "gzip", "otlp", "otlp_sdk",
          "promclient")


def cpu_ms(fn: Callable[[], object], repeat: int) -> float:
    """Median CPU milliseconds of ``fn`` over ``repeat`` calls, after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(1000 * (time.process_time() - start))
    return statistics.median(times)


def promclient_render(body: str) -> Callable[[], bytes]:
    """prometheus_client's render of a registry holding the series of ``body``, gzipped."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    for fam in series_file(body):
        kind = Counter if fam["type"] == "counter" else Gauge
        metric = kind(fam["name"], fam["help"], fam["labels"], registry=registry)
        for values, value in fam["samples"]:
            child = metric.labels(*values) if fam["labels"] else metric
            child.inc(value) if kind is Counter else child.set(value)
    return lambda: gzip.compress(generate_latest(registry), 5)


def measure(node_name: str, repeat: int) -> dict[str, float]:
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, generate_latest

    from otel_gpu import sim
    from otel_gpu.export.collected import CollectingReader
    from otel_gpu.export.otlp.encode import Encoder
    from otel_gpu.export.otlp.metrics import PodResourceExporter
    from otel_gpu.export.prometheus.text import TextWriter
    from otel_gpu.instrument.catalog import all_sources
    from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
    from otel_gpu.sample.sampler import Sampler

    nvml = simulated_nvml(node_name)
    sampler = Sampler(nvml, all_sources(), read_timeout=10.0)
    try:
        state = {"snap": sampler.sample()}
        resource = build_resource(environ={})
        ours, registry = CollectingReader(), CollectorRegistry(auto_describe=False)
        exporter = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
        provider = build_meter_provider(resource, [ours, exporter], lambda: state["snap"],
                                        cardinality_limit=1_000_000)
        writer, encoder = TextWriter(), Encoder()
        data = ours.collect_now()
        body = writer.write(data)
        regroup = PodResourceExporter(_Null(), resource).regroup
        out = {
            "sample": cpu_ms(lambda: state.update(snap=sampler.sample()), repeat),
            "collect": cpu_ms(ours.collect_now, repeat),
            "write": cpu_ms(lambda: writer.write(data), repeat),
            "write_exporter": cpu_ms(lambda: generate_latest(registry), repeat),
            "gzip": cpu_ms(lambda: gzip.compress(body, 5), repeat),
            "otlp": cpu_ms(lambda: encoder.encode(regroup(data)).SerializeToString(), repeat),
            "otlp_sdk": cpu_ms(lambda: encode_metrics(regroup(data)).SerializeToString(),
                               repeat),
            "promclient": cpu_ms(promclient_render(body.decode()), repeat),
        }
        provider.shutdown()
        return out
    finally:
        sampler.close()
        nvml.shutdown()
        sim.uninstall()


class _Null:
    """An exporter that sends nothing (the regrouping reads its preferences)."""

    _preferred_temporality: dict = {}
    _preferred_aggregation: dict = {}


FORMATS = {
    "text 0.0.4": "text/plain;version=0.0.4",
    "OpenMetrics 1.0.0": "application/openmetrics-text;version=1.0.0;q=0.6,"
                         "application/openmetrics-text;version=0.0.1;q=0.5,"
                         "text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
    "OpenMetrics 1.0.0 allow-utf-8": "application/openmetrics-text;version=1.0.0;"
                                     "escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.2",
    "text 1.0.0 allow-utf-8": "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text 1.0.0 dots": "text/plain;version=1.0.0;escaping=dots",
    "text 1.0.0 values": "text/plain;version=1.0.0;escaping=values",
}
"""Format -> the Accept header that asks for it (Prometheus 3's and 2.42's among them)."""


def formats(node_name: str, repeat: int, scrapes: int = 2000) -> dict[str, dict[str, float]]:
    """Per format: ``write`` and ``gzip`` (ms of CPU, once per publication), ``scrape`` (us of
    CPU per cached scrape) and ``bytes``; each round times every format in turn."""
    from otel_gpu import sim
    from otel_gpu.export.collected import CollectingReader
    from otel_gpu.export.prometheus.cache import RenderCache
    from otel_gpu.export.prometheus.exporter import Collection, Writers
    from otel_gpu.export.prometheus.formats import negotiate
    from otel_gpu.instrument.catalog import all_sources
    from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
    from otel_gpu.sample.sampler import Sampler

    nvml = simulated_nvml(node_name)
    sampler = Sampler(nvml, all_sources(), read_timeout=10.0)
    try:
        snap = sampler.sample()
        ours = CollectingReader()
        provider = build_meter_provider(build_resource(environ={}), [ours], lambda: snap,
                                        cardinality_limit=1_000_000)
        data = ours.collect_now()
        writers = Writers()
        collection = Collection(data, [], writers)
        styles = {name: negotiate(accept).style for name, accept in FORMATS.items()}
        bodies = {name: collection.write(style) for name, style in styles.items()}  # warm
        cache = RenderCache(lambda: collection, lambda: 1, max_age=1e9)
        for accept in FORMATS.values():
            cache.get(accept)
        rounds: dict[str, dict[str, list[float]]] = {
            name: {"write": [], "gzip": [], "scrape": []} for name in FORMATS}
        for _ in range(repeat):
            for name, accept in FORMATS.items():
                style, body = styles[name], bodies[name]
                rounds[name]["write"].append(cpu_ms(lambda s=style: writers(s).write(data), 1))
                rounds[name]["gzip"].append(cpu_ms(lambda b=body: gzip.compress(b, 5), 1))
                start = time.process_time()
                for _ in range(scrapes):
                    cache.get(accept)
                rounds[name]["scrape"].append(
                    (time.process_time() - start) / scrapes * 1e6)
        provider.shutdown()
        return {name: {**{k: statistics.median(v) for k, v in r.items()},
                       "bytes": float(len(bodies[name]))} for name, r in rounds.items()}
    finally:
        sampler.close()
        nvml.shutdown()
        sim.uninstall()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=node_list, default="gpus-8,gpus-64,gpus-256")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--formats", action="store_true",
                        help="measure the negotiated exposition formats (see formats())")
    args = parser.parse_args(argv)
    if args.formats:
        print("| node | format | write (ms) | gzip (ms) | cached scrape (us) | body (KiB) |")
        print("|---|---|---|---|---|---|")
        for name in args.configs:
            for fmt, m in formats(name, args.repeat).items():
                print(f"| {name} | {fmt} | {m['write']:.2f} | {m['gzip']:.2f} "
                      f"| {m['scrape']:.1f} | {m['bytes'] / 1024:.0f} |")
                sys.stdout.flush()
        return 0
    print("| node | " + " | ".join(STAGES) + " | render / promclient | cycle / promclient |")
    print("|---" * (len(STAGES) + 3) + "|")
    for name in args.configs:
        m = measure(name, args.repeat)
        render = m["collect"] + m["write"] + m["gzip"]
        print(f"| {name} | " + " | ".join(f"{m[s]:.1f}" for s in STAGES)
              + f" | {render / m['promclient']:.2f}"
              + f" | {(render + m['sample']) / m['promclient']:.2f} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
