"""The process_* series at the head of each /metrics answer: every format and escaping the
scrape negotiates, read by the reference parsers, and the gzipped answer one gzip member."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from types import SimpleNamespace

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as read_om
from prometheus_client.parser import text_string_to_metric_families as read_text

from otel_gpu.export.prometheus.cache import GZIP_LEVEL
from otel_gpu.export.prometheus.formats import Style
from otel_gpu.export.prometheus.opengzip import OpenGzip
from otel_gpu.export.prometheus.process import NAMES, ProcessScrape, style_of, write
from otel_gpu.instrument.process import ProcessStats

STATS = ProcessStats(cpu_user_s=1.5, cpu_system_s=0.25, resident_bytes=50 << 20,
                     virtual_bytes=400 << 20, start_time_s=1700000000.5, open_fds=12,
                     max_fds=1024)
BODY = b'# HELP demo_value a value\n# TYPE demo_value gauge\ndemo_value 7.0\n'
OM_BODY = BODY + b"# EOF\n"


def _fixed(stats: ProcessStats = STATS) -> SimpleNamespace:
    """A reader answering ``reader.stats``, which a test may change."""
    reader = SimpleNamespace(stats=stats)
    reader.read = lambda: reader.stats
    return reader


def _values(families) -> dict[str, float]:
    return {s.name: s.value for f in families for s in f.samples}


def test_text_has_prometheus_clients_names_and_values():
    text = write(STATS, Style(False, "underscores")).decode()
    assert _values(read_text(text)) == {
        "process_cpu_seconds_total": 1.75, "process_resident_memory_bytes": 50 << 20,
        "process_virtual_memory_bytes": 400 << 20, "process_start_time_seconds": 1700000000.5,
        "process_open_fds": 12, "process_max_fds": 1024}
    assert "# TYPE process_cpu_seconds_total counter" in text


def test_openmetrics_names_the_counter_family_without_total_and_gives_units():
    text = write(STATS, Style(True, "underscores")).decode() + "# EOF\n"
    families = {f.name: f for f in read_om(text)}
    assert families["process_cpu_seconds"].type == "counter"
    assert families["process_cpu_seconds"].unit == "seconds"
    assert families["process_resident_memory_bytes"].unit == "bytes"
    assert _values(families.values())["process_cpu_seconds_total"] == 1.75


def test_dots_escaping_doubles_the_underscores_as_the_rest_of_the_body():
    text = write(STATS, Style(False, "dots")).decode()
    assert "process__open__fds 12\n" in text and "process_open_fds" not in text


def test_a_value_proc_did_not_give_is_left_out():
    text = write(ProcessStats(open_fds=3), Style(False, "underscores")).decode()
    assert _values(read_text(text)) == {"process_open_fds": 3}
    assert write(ProcessStats(), Style(True, "underscores")) == b""


@pytest.mark.parametrize(("content_type", "style"), [
    ("text/plain; version=0.0.4; charset=utf-8", Style(False, "underscores")),
    ("application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=allow-utf-8",
     Style(True, "allow-utf-8")),
    ("text/plain; version=1.0.0; charset=utf-8; escaping=dots", Style(False, "dots")),
])
def test_the_style_is_read_off_the_content_type(content_type, style):
    assert style_of(content_type) == style


def test_the_gzipped_answer_is_the_bodys_member_open_before_its_tail():
    """One member (readers that stop after the first miss nothing), and the body is not
    compressed again per scrape: the answer starts with the body's own compressed head."""
    head = write(STATS, Style(False, "underscores"))
    body = BODY * 5000 + b"# EOF\n"
    opened = OpenGzip(body, len(body) - 6, GZIP_LEVEL)
    joined = opened.with_lines(head)
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert inflate.decompress(joined) == BODY * 5000 + head + b"# EOF\n"
    assert inflate.eof and not inflate.unused_data
    assert joined.startswith(opened.head) and len(opened.head) > 100
    assert gzip.decompress(opened.with_lines(b"")) == body
    with pytest.raises(ValueError, match="cut 7 outside"):
        OpenGzip(b"short", 7, GZIP_LEVEL)


def test_an_open_member_holds_its_bytes_and_no_compressor():
    """A deflate compressor's state is a quarter of a mebibyte: kept per format written,
    it would be most of what a small body costs to hold."""
    body = BODY * 20
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        opened = OpenGzip(body, len(body), GZIP_LEVEL)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < len(opened.head) + 16_384, held
    assert gzip.decompress(opened.with_lines(b"x 1\n")) == body + b"x 1\n"


def _scrape(reader=None, body=BODY):
    cache = ProcessScrape(lambda: body, lambda: 1, max_age=60.0,
                          **({"reader": reader} if reader else {}))
    return cache, cache.get()


def test_each_answer_ends_with_the_process_read_at_that_scrape():
    reader = _fixed()
    cache, first = _scrape(reader)
    assert first.body.startswith(BODY)
    assert first.body[len(BODY):].startswith(b"# HELP process_cpu_seconds_total ")
    assert gzip.decompress(first.gzipped) == first.body
    reader.stats = ProcessStats(open_fds=99)
    second = cache.get()
    assert b"process_open_fds 99\n" in second.body and cache.renders == 1  # not re-rendered
    assert second.key == first.key


def test_openmetrics_keeps_eof_last():
    body = SimpleNamespace(write=lambda style: OM_BODY if style.openmetrics else BODY)
    cache = ProcessScrape(lambda: body, lambda: 1, max_age=60.0, reader=_fixed())
    answer = cache.get("application/openmetrics-text;version=1.0.0")
    text = answer.body.decode()
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    assert {"process_cpu_seconds", "demo_value"} <= {f.name for f in read_om(text)}


def test_the_real_process_is_served():
    _, answer = _scrape()
    served = {s.name for f in read_text(answer.body.decode()) for s in f.samples}
    assert set(NAMES) <= served
