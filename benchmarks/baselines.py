"""The two baselines the collector is measured against, each a process of its own.

``promclient``: a hand-written prometheus_client exporter holding the same
series as the collector (read from a series file the harness writes from the
collector's own body): one Gauge or Counter per family, every child's value
set again each ``--interval`` (what a hand-written exporter's update loop
does), and the body rendered on every request by prometheus_client's own
HTTP server, as such an exporter serves it.

``static``: the collector's body, rendered once, served from memory by a
keep-alive http.server: the floor any exporter written in Python can reach.

    python -m benchmarks.baselines promclient|static --series FILE --port-file FILE
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def series_file(body: str) -> list[dict]:
    """The families of a Prometheus text body: name, type, help, label names, samples."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(body):
        if family.type not in ("gauge", "counter", "unknown", "untyped"):
            continue
        suffix = "_total" if family.type == "counter" else ""
        rows = [s for s in family.samples if s.name == family.name + suffix]
        names = sorted({k for s in rows for k in s.labels})
        out.append({
            "name": family.name, "type": family.type, "help": family.documentation or "-",
            "labels": names,
            "samples": [[[s.labels.get(k, "") for k in names], s.value] for s in rows],
        })
    return out


def announce(port_file: Path, port: int) -> None:
    """Write the port atomically: the harness reads the file once it exists."""
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    os.replace(tmp, port_file)


def serve_promclient(families: list[dict], interval: float, port_file: Path) -> None:
    import prometheus_client
    from prometheus_client import Counter, Gauge, start_http_server

    prometheus_client.disable_created_metrics()
    for collector in list(prometheus_client.REGISTRY._collector_to_names):
        prometheus_client.REGISTRY.unregister(collector)  # no process/platform series
    children = []
    for fam in families:
        kind = Counter if fam["type"] == "counter" else Gauge
        metric = kind(fam["name"], fam["help"], fam["labels"])
        for values, value in fam["samples"]:
            child = metric.labels(*values) if fam["labels"] else metric
            children.append((kind is Counter, child, value))

    def update() -> None:
        step = 0
        while True:
            for counter, child, value in children:
                if counter:
                    child.inc(1)
                else:
                    child.set(value + step % 2)
            step += 1
            time.sleep(interval)

    threading.Thread(target=update, daemon=True).start()
    server, _ = start_http_server(0, addr="127.0.0.1")
    announce(port_file, server.server_port)
    threading.Event().wait()


class _Static(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b""
    gzipped = b""

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        gz = "gzip" in (self.headers.get("Accept-Encoding") or "")
        body = self.gzipped if gz else self.body
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                + ("Content-Encoding: gzip\r\n" if gz else "")
                + f"Content-Length: {len(body)}\r\n\r\n")
        self.wfile.write(head.encode() + body)  # one write, as the collector answers

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_static(body: bytes, port_file: Path) -> None:
    _Static.body, _Static.gzipped = body, gzip.compress(body, 5)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Static)
    server.daemon_threads = True
    announce(port_file, server.server_port)
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A benchmark baseline exporter.")
    parser.add_argument("kind", choices=("promclient", "static"))
    parser.add_argument("--series", type=Path, required=True,
                        help="the series file (promclient) or body file (static)")
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.kind == "static":
        serve_static(args.series.read_bytes(), args.port_file)
    else:
        serve_promclient(json.loads(args.series.read_text()), args.interval, args.port_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
