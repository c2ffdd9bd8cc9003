"""Content negotiation on /metrics: which format an Accept header gets, how names are
escaped, and that each format is written once per publication and only when asked for."""

from __future__ import annotations

import gzip

import pytest

from otel_gpu.export.http.endpoint import LANDING, MetricsServer
from otel_gpu.export.prometheus.cache import RenderCache
from otel_gpu.export.prometheus.formats import (
    ALLOW_UTF8,
    DOTS,
    TEXT_0_0_4,
    UNDERSCORES,
    VALUES,
    Format,
    escape_name,
    negotiate,
)
from testkit.exposition import CountingCollection
from testkit.process import http_get

OM1 = "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping={}"
PROMETHEUS_2_42 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                   "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_3 = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
                "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1")
PROTOBUF_FIRST = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                  "encoding=delimited;q=0.9," + PROMETHEUS_2_42.replace("version=1.0.0,",
                                                                        "version=1.0.0;q=0.8,"))


@pytest.mark.parametrize(("accept", "content_type"), [
    (None, "text/plain; version=0.0.4; charset=utf-8"),
    ("", "text/plain; version=0.0.4; charset=utf-8"),
    ("*/*", "text/plain; version=0.0.4; charset=utf-8"),
    ("application/json", "text/plain; version=0.0.4; charset=utf-8"),
    ("text/plain", "text/plain; version=0.0.4; charset=utf-8"),
    (PROMETHEUS_2_42, OM1.format("underscores")),
    (PROMETHEUS_3, OM1.format("underscores")),  # UTF-8 allowed, not asked for: see below
    (PROTOBUF_FIRST, OM1.format("underscores")),  # not served: the next choice
    ("application/openmetrics-text;version=0.0.1",
     "application/openmetrics-text; version=0.0.1; charset=utf-8; escaping=underscores"),
    ("text/plain;version=1.0.0;escaping=dots",
     "text/plain; version=1.0.0; charset=utf-8; escaping=dots"),
    ("text/plain;version=1.0.0;escaping=nonsense",
     "text/plain; version=1.0.0; charset=utf-8; escaping=underscores"),
    # q-values, not the order, decide; the order breaks ties
    ("text/plain;version=0.0.4;q=0.2,text/plain;version=1.0.0;escaping=values;q=0.9",
     "text/plain; version=1.0.0; charset=utf-8; escaping=values"),
    ("text/plain;version=1.0.0;escaping=values;q=0.5,application/openmetrics-text;q=0.5",
     "text/plain; version=1.0.0; charset=utf-8; escaping=values"),
    ("application/openmetrics-text;q=0,text/plain;version=1.0.0",
     "text/plain; version=1.0.0; charset=utf-8; escaping=underscores"),
    ("application/openmetrics-text;version=2.0.0, text/plain;version=9",
     "text/plain; version=0.0.4; charset=utf-8"),
    ("application/openmetrics-text;q=bad", "text/plain; version=0.0.4; charset=utf-8"),
])
def test_negotiation_picks_the_highest_q_served_here(accept, content_type):
    assert negotiate(accept).content_type == content_type


def test_utf8_names_go_only_to_a_scraper_that_allows_them_when_the_setting_is_on():
    """Prometheus 3 allows UTF-8 names by default: without ``prometheus_utf8_names`` it
    gets the underscore names its dashboards and rules were written against."""
    assert negotiate(PROMETHEUS_3, True).content_type == OM1.format("allow-utf-8")
    assert negotiate(PROMETHEUS_3, False).content_type == OM1.format("underscores")
    assert negotiate(PROMETHEUS_2_42, True).content_type == OM1.format("underscores")
    dots = "text/plain;version=1.0.0;escaping=dots"  # asked for by name: served as asked
    assert negotiate(dots, False).content_type.endswith("escaping=dots")


def test_formats_that_write_the_same_bytes_share_a_style():
    assert TEXT_0_0_4.style == Format("text/plain", "1.0.0").style
    assert (Format("application/openmetrics-text", "0.0.1", DOTS).style
            == Format("application/openmetrics-text", "1.0.0", DOTS).style)


@pytest.mark.parametrize(("name", "escaping", "escaped"), [
    ("hw.gpu.utilization", UNDERSCORES, "hw_gpu_utilization"),
    ("hw.gpu.utilization", DOTS, "hw_dot_gpu_dot_utilization"),
    ("hw.gpu.utilization", VALUES, "U__hw_2e_gpu_2e_utilization"),
    ("hw.gpu.utilization", ALLOW_UTF8, "hw.gpu.utilization"),
    ("nvidia.gpu.pci_bus_id", DOTS, "nvidia_dot_gpu_dot_pci__bus__id"),
    ("nvidia.gpu.pci_bus_id", VALUES, "U__nvidia_2e_gpu_2e_pci__bus__id"),
    ("DCGM_FI_DEV_GPU_UTIL", DOTS, "DCGM__FI__DEV__GPU__UTIL"),  # dots escapes every _
    ("DCGM_FI_DEV_GPU_UTIL", VALUES, "DCGM_FI_DEV_GPU_UTIL"),
    ("9lives/x", UNDERSCORES, "_lives_x"),
    ("9lives/x", VALUES, "U___39_lives_2f_x"),
    ("ünï", DOTS, "__n__"),
])
def test_escaping_schemes(name, escaping, escaped):
    assert escape_name(name, escaping) == escaped


OM = Format("application/openmetrics-text", "1.0.0").style
UTF8 = Format("text/plain", "1.0.0", ALLOW_UTF8).style


def test_each_format_is_written_once_per_publication_and_only_when_asked(clock):
    key, written = {"seq": 1}, []
    cache = RenderCache(lambda: CountingCollection(key["seq"], written), lambda: key["seq"],
                        max_age=100.0, clock=clock, idle_after=30.0, utf8_names=True)
    first = cache.get(PROMETHEUS_2_42)
    assert first.body == b'demo_seq{style="underscores"} 1\n# EOF\n'
    assert gzip.decompress(first.gzipped) == first.body
    assert cache.get(PROMETHEUS_2_42) is first
    assert cache.get("application/openmetrics-text;version=0.0.1").body == first.body
    assert written == [(1, OM)]  # one collection, one body: no 0.0.4 nobody asked for
    cache.get("text/plain;version=1.0.0;escaping=allow-utf-8")
    assert written == [(1, OM), (1, UTF8)] and cache.renders == 1
    key["seq"] = 2
    cache.refresh()  # the publication writes what was scraped lately, before the scrapes
    assert sorted(written[2:], key=str) == sorted([(2, OM), (2, UTF8)], key=str)
    assert cache.get(PROMETHEUS_2_42).body.endswith(b" 2\n# EOF\n")
    assert len(written) == 4 and cache.writes == {OM: 2, UTF8: 2}
    clock.advance(31.0)  # UTF-8 not asked for 30 s: no longer written ahead
    cache.get(PROMETHEUS_2_42)
    key["seq"] = 3
    cache.refresh()
    assert written[4:] == [(3, OM)]


def test_a_render_of_bytes_serves_text_0_0_4_whatever_is_asked(clock):
    cache = RenderCache(lambda: b"demo 1\n", lambda: 1, max_age=10.0, clock=clock)
    assert cache.get(PROMETHEUS_3).content_type == TEXT_0_0_4.content_type


@pytest.fixture
def server():
    cache = RenderCache(lambda: CountingCollection(1, []), lambda: 1, max_age=60.0, utf8_names=True)
    srv = MetricsServer(("127.0.0.1", 0), cache, lambda: (True, "ready"))
    srv.start()
    yield srv
    srv.stop()


def test_the_response_says_what_it_is(server):
    url = f"http://127.0.0.1:{server.port}/metrics"
    status, headers, body = http_get(url, headers={"Accept": PROMETHEUS_3})
    assert status == 200 and headers["Content-Type"] == OM1.format("allow-utf-8")
    assert body.endswith(b"# EOF\n") and "Accept" in headers["Vary"]
    status, headers, body = http_get(url)
    assert headers["Content-Type"] == TEXT_0_0_4.content_type and b"# EOF" not in body


def test_head_answers_the_headers_of_get_without_the_body(server):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for accept in (PROMETHEUS_2_42, "text/plain"):
            conn.request("GET", "/metrics", headers={"Accept": accept})
            get = conn.getresponse()
            body = get.read()
            conn.request("HEAD", "/metrics", headers={"Accept": accept})
            head = conn.getresponse()
            assert head.status == 200 and head.read() == b""  # and the connection lives on
            assert head.getheader("Content-Type") == get.getheader("Content-Type")
            assert int(head.getheader("Content-Length")) == len(body) > 0
    finally:
        conn.close()


def test_the_landing_page_links_the_paths_and_names_the_version(server):
    from otel_gpu import __version__

    status, headers, body = http_get(f"http://127.0.0.1:{server.port}/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    page = body.decode()
    assert page == LANDING.format(version=__version__)
    for path in ("metrics", "healthz", "readyz"):
        assert f'href="{path}"' in page
    assert __version__ in page
