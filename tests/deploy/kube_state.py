"""kube-state-metrics' ``kube_pod_labels`` for the node stack's pods, so the documented
showback queries that join it (docs/kubernetes.md, "GPU time per workload") meet what a
cluster with kube-state-metrics has: a second scrape job serving each pod's team label."""

from __future__ import annotations

import http.server
import threading

from tests.support.prometheus_server import PrometheusServer

TEAMS = {("ml", "train-0"): "llm", ("ml", "mig-big"): "llm", ("serve", "api-a"): "inference",
         ("serve", "api-b"): "inference", ("research", "mig-small"): "research",
         ("research", "notebook"): "research"}
"""(namespace, pod) -> the pod's ``team`` label, for every pod of ``tests/deploy/stack.py``."""


def exposition(teams: dict[tuple[str, str], str] = TEAMS) -> bytes:
    """The series kube-state-metrics writes with ``--metric-labels-allowlist=pods=[team]``."""
    lines = ["# HELP kube_pod_labels Kubernetes labels converted to Prometheus labels.",
             "# TYPE kube_pod_labels gauge"]
    lines += [f'kube_pod_labels{{namespace="{ns}",pod="{pod}",uid="uid-{pod}",'
              f'label_team="{team}"}} 1' for (ns, pod), team in sorted(teams.items())]
    return ("\n".join(lines) + "\n").encode()


class KubeStateMetrics(http.server.ThreadingHTTPServer):
    """Serves :func:`exposition` on a free 127.0.0.1 port until :meth:`close`."""

    def __init__(self) -> None:
        body = exposition()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                        name="kube-state-metrics")
        self._thread.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)


class WithKubeState(PrometheusServer):
    """Scrapes the collector (job ``otel-gpu``) and kube-state-metrics (its own job)."""

    def __init__(self, targets: list[str], kube_state: str, **kw) -> None:
        super().__init__(targets, **kw)
        self.kube_state = kube_state

    def config(self) -> dict:
        config = super().config()
        (job,) = config["scrape_configs"]
        config["scrape_configs"].append({**job, "job_name": "kube-state-metrics",
                                         "static_configs": [{"targets": [self.kube_state]}]})
        return config
