"""Prometheus text exposition, read exactly as written.

A client library's parser renames counters (drops ``_total``) and merges
families; these helpers keep every sample line's own name and labels.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.naming import Profile
from otel_gpu.export.naming.exposition import render
from otel_gpu.export.prometheus.exporter import collect_families
from otel_gpu.export.prometheus.formats import Style
from otel_gpu.export.prometheus.text import TextWriter
from otel_gpu.snapshot import Snapshot

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def new_reader() -> tuple[CollectingReader, Callable[[], bytes]]:
    """A reader collecting on demand, and the function writing one collection of it as the
    endpoint does (no scope labels, ``target_info``)."""
    reader = CollectingReader()
    writer = TextWriter(scope_labels=False, target_info=True)
    return reader, lambda: writer.write(reader.collect_now())


def render_profiles(profiles: Sequence[Profile], snapshot: Snapshot | None) -> bytes:
    """The profiles' series alone, as the endpoint writes them after the instruments'."""
    return render(collect_families(profiles, snapshot)).encode()


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line, in order."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        assert match, f"not an exposition line: {line!r}"
        name, labels, value = match.groups()
        parsed = {
            k: re.sub(r"\\.", lambda m: _UNESCAPE.get(m.group(0), m.group(0)), v)
            for k, v in _LABEL.findall(labels or "")
        }
        out.append((name, parsed, float(value)))
    return out


def without_empty_labels(body: bytes) -> bytes:
    """``body`` as Prometheus stores it: every ``name=""`` label left out of each sample
    line (an empty label is no label), and ``{}`` left by that with it."""
    out = []
    for line in body.decode("utf-8").split("\n"):
        match = _LINE.match(line) if line and not line.startswith("#") else None
        if match and match.group(2) is not None:
            name, block, value = match.groups()
            kept = ",".join(m.group(0) for m in _LABEL.finditer(block) if m.group(2))
            line = f"{name}{{{kept}}} {value}" if kept else f"{name} {value}"
        out.append(line)
    return "\n".join(out).encode("utf-8")


def series(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of the samples named ``name`` whose labels include ``labels``."""
    return [
        (lab, value)
        for n, lab, value in parse_samples(text)
        if n == name and all(lab.get(k) == v for k, v in labels.items())
    ]


class ExpositionTarget:
    """A fixed text exposition on 127.0.0.1:0, recording how it was scraped."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.accept_headers: list[str] = []
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                target.accept_headers.append(self.headers.get("Accept", ""))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(target.body)))
                self.end_headers()
                self.wfile.write(target.body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep pytest output clean

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


class CountingCollection:
    """A collection that counts what it writes, by style."""

    def __init__(self, seq: int, written: list) -> None:
        self.seq = seq
        self.written = written

    def write(self, style: Style) -> bytes:
        self.written.append((self.seq, style))
        tail = b"# EOF\n" if style.openmetrics else b""
        return f"demo_seq{{style=\"{style.escaping}\"}} {self.seq}\n".encode() + tail
