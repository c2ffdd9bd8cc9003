"""The two baselines the collector is measured against, each a process of its own.

``promclient``: a hand-written prometheus_client exporter holding the same
series as the collector (read from a series file the harness writes from the
collector's own body): one Gauge or Counter per family, every child's value
set again each ``--interval`` (what a hand-written exporter's update loop
does), and the body rendered on every request by prometheus_client's own
HTTP server, as such an exporter serves it.

With ``--kubelet SOCKET`` (``promclient+kubelet`` in the reports) it also does
what such an exporter must do to put pods on its series: ask the kubelet's Pod
Resources API for them every second (the collector's ``--kubelet-interval`` in
the benchmark) through grpcio and the API's generated messages, and keep the
answer's devices per container. Its RSS is then the one to hold the collector's
against on a node with pods: grpcio and protobuf are 20 MiB of its 50 at 500 pods.

``static``: the collector's body, rendered once, served from memory by a
keep-alive http.server: the floor any exporter written in Python can reach.

    python -m benchmarks.baselines promclient|static --series FILE --port-file FILE
                                   [--kubelet SOCKET]
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


PROMCLIENT_KUBELET = "promclient+kubelet"
"""The promclient baseline asking the kubelet for its pods (``--kubelet``)."""
KUBELET_INTERVAL = 1.0


def poll_kubelet(socket_path: str, interval: float, answers: list[int]) -> None:
    """Ask the kubelet for its pods every ``interval``, keeping each container's devices
    from the latest answer; ``answers`` holds the latest answer's count of containers."""
    import grpc

    from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2

    channel = grpc.insecure_channel(f"unix://{socket_path}")
    ask = channel.unary_unary(
        "/v1.PodResourcesLister/List",
        request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
        response_deserializer=api_pb2.ListPodResourcesResponse.FromString)
    devices: dict[tuple[str, str, str], list[str]] = {}
    while True:
        try:
            response = ask(api_pb2.ListPodResourcesRequest(), timeout=5.0)
        except grpc.RpcError:
            pass
        else:
            devices = {(pod.namespace, pod.name, c.name):
                       [i for d in c.devices for i in d.device_ids]
                       for pod in response.pod_resources for c in pod.containers}
            answers[:] = [len(devices)]
        time.sleep(interval)


def announce(port_file: Path, port: int) -> None:
    """Write the port atomically: the harness reads the file once it exists."""
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    os.replace(tmp, port_file)


def serve_promclient(families: list[dict], interval: float, port_file: Path,
                     kubelet: str | None = None) -> None:
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
    if kubelet is not None:
        answers: list[int] = []
        threading.Thread(target=poll_kubelet, args=(kubelet, KUBELET_INTERVAL, answers),
                         daemon=True).start()
        deadline = time.monotonic() + 60
        while not answers:  # serving only once it has the pods, as the collector does
            if time.monotonic() > deadline:
                raise SystemExit(f"the kubelet at {kubelet} never answered")
            time.sleep(0.01)
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
    parser.add_argument("--kubelet", help="promclient: a Pod Resources socket to ask")
    args = parser.parse_args(argv)
    if args.kind == "static":
        serve_static(args.series.read_bytes(), args.port_file)
    else:
        serve_promclient(json.loads(args.series.read_text()), args.interval, args.port_file,
                         args.kubelet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
