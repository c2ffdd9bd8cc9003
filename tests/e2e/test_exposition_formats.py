"""Every exposition format /metrics negotiates, end to end: read by the reference parsers
(prometheus_client's), the same samples in each, golden files of the h100x8 scenario, and
a real Prometheus (Debian's 2.42 asks for OpenMetrics first) storing the same series and
values from OpenMetrics as from text 0.0.4."""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as read_om
from prometheus_client.parser import text_string_to_metric_families as read_text

from testkit.process import CollectorProcess, serve_args
from tests.support.prometheus_server import (
    AsText004Proxy,
    TwoJobs,
    skip_unless_available,
)

GOLDEN = Path(__file__).parent / "golden"
OPENMETRICS = "application/openmetrics-text;version=1.0.0"
FORMATS = {
    "text-0.0.4": "text/plain;version=0.0.4",
    "openmetrics-1.0.0": OPENMETRICS,
    "openmetrics-0.0.1": "application/openmetrics-text;version=0.0.1",
    "openmetrics-1.0.0-allow-utf-8": OPENMETRICS + ";escaping=allow-utf-8",
    "text-1.0.0-underscores": "text/plain;version=1.0.0;escaping=underscores",
    "text-1.0.0-allow-utf-8": "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text-1.0.0-dots": "text/plain;version=1.0.0;escaping=dots",
    "text-1.0.0-values": "text/plain;version=1.0.0;escaping=values",
}


@pytest.fixture(scope="module")
def h100(tmp_path_factory):
    """One sample of h100x8 (no second one for an hour), OpenTelemetry and dcgm names."""
    proc = CollectorProcess(serve_args("--simulate", "h100x8", "--naming", "otel,dcgm",
                                       "--node-name", "gpu-node-1",
                                       "--prometheus-utf8-names", "true", interval="1h"))
    try:
        proc.wait_serving()
        proc.metrics()  # the first sample is out
        yield proc
    finally:
        proc.stop()


def _scrape(proc: CollectorProcess, accept: str) -> tuple[str, str]:
    status, headers, body = proc.get("/metrics", headers={"Accept": accept})
    assert status == 200, body
    return headers["Content-Type"], body.decode()


def _families(accept: str, text: str) -> list:
    return list((read_om if "openmetrics" in accept else read_text)(text))


def _values(families) -> Counter:
    """Every sample as (its label values, its value): what no escaping changes (the process
    series' values are each scrape's own)."""
    return Counter((tuple(sorted(s.labels.values())),
                    None if s.name.startswith("process_") else s.value)
                   for f in families for s in f.samples)


def test_every_format_parses_and_carries_the_same_samples(h100):
    reference = _families("text/plain", _scrape(h100, FORMATS["text-0.0.4"])[1])
    names = {s.name for f in reference for s in f.samples}
    assert len(reference) > 70 and "hw_gpu_utilization" in names
    for label, accept in FORMATS.items():
        content_type, text = _scrape(h100, accept)
        assert accept.split(";")[0] in content_type, label
        families = _families(accept, text)
        assert _values(families) == _values(reference), label
        if "openmetrics" in accept:
            assert text.endswith("\n# EOF\n")
            energy = next(f for f in families if f.name in ("hw_energy_joules", "hw.energy"))
            assert energy.type == "counter"
            assert {s.name for s in energy.samples} == {energy.name + "_total"}
            assert energy.unit == ("joules" if "utf-8" not in accept else "")
            dcgm = next(f for f in families if f.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
            assert dcgm.type == "unknown"  # its name has no _total: kept, not a counter


def test_allow_utf8_keeps_the_semantic_convention_names(h100):
    for accept in (FORMATS["text-1.0.0-allow-utf-8"], FORMATS["openmetrics-1.0.0-allow-utf-8"]):
        content_type, text = _scrape(h100, accept)
        assert content_type.endswith("; escaping=allow-utf-8")
        assert re.search(r'^\{"hw\.gpu\.utilization",.*"hw\.id"="GPU-[0-9a-f-]+"', text, re.M)
        families = {f.name: f for f in _families(accept, text)}
        utilization = families["hw.gpu.utilization"]
        assert {s.name for s in utilization.samples} == {"hw.gpu.utilization"}
        assert all(s.labels["hw.id"].startswith("GPU-") for s in utilization.samples)
        assert "hw.power" in families and "hw_power_watts" not in families
        assert "DCGM_FI_DEV_GPU_UTIL" in families  # legacy names stay as they are
        assert families["otel_gpu.build.info"].samples[0].value == 1.0


def test_prometheus_3_gets_the_underscore_names_by_default(collector):
    """Its default Accept allows UTF-8 first; the dashboards and rules need the underscore
    names, so only ``prometheus_utf8_names`` hands it the OpenTelemetry ones."""
    proc = collector("--simulate", "h100x8")
    proc.metrics()
    content_type, text = _scrape(proc, FORMATS["openmetrics-1.0.0-allow-utf-8"])
    assert content_type.endswith("; escaping=underscores")
    assert "\nhw_gpu_utilization{" in text and '"hw.gpu.utilization"' not in text


def test_dots_and_values_escape_the_semantic_convention_names(h100):
    families = {f.name for f in _families("text", _scrape(h100, FORMATS["text-1.0.0-dots"])[1])}
    assert {"hw_dot_gpu_dot_utilization", "DCGM__FI__DEV__GPU__UTIL"} <= families
    text = _scrape(h100, FORMATS["text-1.0.0-values"])[1]
    assert {"U__hw_2e_gpu_2e_utilization", "DCGM_FI_DEV_GPU_UTIL"} <= {
        f.name for f in _families("text", text)}


def test_build_info_names_the_versions(h100):
    (family,) = [f for f in _families("text", _scrape(h100, "text/plain")[1])
                 if f.name == "otel_gpu_build_info"]
    (sample,) = family.samples
    assert sample.value == 1.0
    assert set(sample.labels) == {"otel_gpu_version", "process_runtime_version",
                                  "otel_gpu_pynvml_version", "telemetry_sdk_version"}
    assert all(sample.labels.values())


# --- golden files ---------------------------------------------------------------------

GOLDEN_FORMATS = ("openmetrics-1.0.0", "openmetrics-1.0.0-allow-utf-8", "text-1.0.0-allow-utf-8",
                  "text-1.0.0-dots", "text-1.0.0-values")
# run to run (and release to release): versions, host, instance id; ages, durations, requests
# and the process_* series
_VARYING_LABEL = re.compile(
    r'((?:"|\b)[\w.]*?(?:host[\w.]*name|instance[\w.]*id|(?:service|sdk|runtime|gpu|pynvml)'
    r'[\w.]*version)"?)="(?:[^"\\]|\\.)*"')
_VARYING_VALUE = re.compile(r"otel[\w.]*(?:age|duration|requests)|^process_")


def _normalised(text: str) -> str:
    """The body with what varies between runs replaced by ``<varies>``, each family's
    samples sorted (headers first, in the order served)."""
    out: list[str] = []
    block: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            out += sorted(block)
            block = []
            out.append(line)
            continue
        line = _VARYING_LABEL.sub(r'\1="<varies>"', line)
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0] or head.split('"', 2)[1]
        block.append(f"{head} <varies>" if _VARYING_VALUE.search(name) else line)
    return "\n".join(out + sorted(block)) + "\n"


@pytest.fixture(scope="module")
def h100_otel():
    proc = CollectorProcess(serve_args("--simulate", "h100x8", "--naming", "otel",
                                       "--node-name", "gpu-node-1",
                                       "--prometheus-utf8-names", "true", interval="1h"))
    try:
        proc.wait_serving()
        proc.metrics()
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("label", GOLDEN_FORMATS)
def test_golden_exposition_in_each_format(h100_otel, label):
    content_type, text = _scrape(h100_otel, FORMATS[label])
    text = f"# Content-Type: {content_type}\n" + _normalised(text)
    path = GOLDEN / f"otel-h100x8-{label}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; UPDATE_GOLDEN=1 rewrites it"


# --- a real Prometheus ----------------------------------------------------------------


@pytest.mark.slow
def test_prometheus_stores_the_same_samples_from_openmetrics_as_from_text(h100, tmp_path):
    binary = skip_unless_available()
    proxy = AsText004Proxy(f"http://127.0.0.1:{h100.port}")
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        server = TwoJobs(f"127.0.0.1:{h100.port}", f"127.0.0.1:{proxy.server_address[1]}",
                          binary=binary, workdir=tmp_path)
        with server:
            server.wait_for_query('count(up{job="openmetrics"} == 1) + count(up{job="text"} == 1)')
            server.wait_for_query('count({job="openmetrics"}) == count({job="text"}) '
                                  'and count({job="text"}) > 1000')

            def stored(job: str) -> Counter:
                return Counter((tuple(sorted((k, v) for k, v in labels.items()
                                             if k not in ("job", "instance"))),
                                # timings, and Prometheus's own count of series new at
                                # the last scrape (each job's first scrape adds them all),
                                # and the process series, read at each scrape
                                value if not re.search(r"_seconds$|requests|^scrape_series_added$"
                                                       r"|^process_",
                                                       labels["__name__"])
                                else None)
                               for labels, value in server.query(f'{{job="{job}"}}'))

            assert stored("openmetrics") == stored("text")
            metadata = server._api("/api/v1/metadata", {"metric": "hw_energy_joules"})
            assert {"type": "counter", "unit": "joules"}.items() <= metadata[
                "hw_energy_joules"][0].items()  # it was OpenMetrics that it read
        assert proxy.asked and proxy.asked[0].startswith("application/openmetrics-text")
    finally:
        proxy.shutdown()
        proxy.server_close()
