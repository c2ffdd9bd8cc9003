"""The pod stage's state from the first sample: a kubelet slow to answer at the start must
not leave the first publications without the per-pod families (their unattributed rows)."""

from __future__ import annotations

import threading

from otel_gpu.attribute.k8s import kubelet_rpc
from otel_gpu.config import load
from otel_gpu.sample.library import Nvml
from otel_gpu.wiring import Service
from testkit.exposition import series
from testkit.kubelet import container, devices, pod
from testkit.process import http_get, wait_until
from tests.support.nvml import profile_uuids

ENERGY = "nvidia_gpu_k8s_energy_joules_total"


def _energy(service: Service, gpu: str) -> dict[str | None, float]:
    """The GPU's per-pod energy rows in /metrics, by pod name (None: the unattributed row)."""
    status, _, body = http_get(f"http://127.0.0.1:{service.server.port}/metrics")
    assert status == 200, body
    return {lab.get("k8s_pod_name") or None: value
            for lab, value in series(body.decode(), ENERGY, hw_id=gpu)}


def test_the_first_sample_has_the_unattributed_rows_while_the_first_list_is_unanswered(
        fake_nvml, kubelet, monkeypatch):
    """A socket there at the start: the pod stage knows it has no pods yet, so the first
    sample carries each GPU's unattributed row although the kubelet has not answered; the
    pod's own row follows the answer."""
    fake_nvml("t4")
    gpu, *others = profile_uuids("t4")
    kubelet.set_pods([pod("train", container("main", devices("nvidia.com/gpu", gpu)))])
    asked, release = threading.Event(), threading.Event()
    call = kubelet_rpc.KubeletChannel.call

    def held(self, *args, **kw):  # the kubelet's first answer comes when the test says
        asked.set()
        release.wait(30)
        return call(self, *args, **kw)

    monkeypatch.setattr(kubelet_rpc.KubeletChannel, "call", held)
    config = load({"listen": "127.0.0.1:0", "interval": "30s", "kubelet_interval": "30s",
                   "kubelet_socket": kubelet.socket_path}, environ={})
    nvml = Nvml()
    nvml.init()
    service = Service(config, nvml, environ={})
    service.start()
    try:
        first = service.store.wait_for(1, 10)
        assert first is not None and first.seq == 1 and first.pods is not None
        assert asked.wait(10), "the watcher never asked the kubelet"
        assert service.store.version == 1  # nothing answered: still the first publication
        assert first.pods.energy, "no per-pod rows in the first sample"
        for each in (gpu, *others):  # each GPU's unattributed row, and only that
            assert list(_energy(service, each)) == [None], each
        release.set()
        wait_until(lambda: "train" in _energy(service, gpu), 10, "the pod's row")
    finally:
        release.set()
        service.stop(0.5)
