"""The largest node the collector is built for: 512 GPUs and 5,000 time-sliced pods.

Every series must be present: no family loses a GPU to a cardinality limit, and
no pod's allocation row is folded into an overflow series.
"""

from __future__ import annotations

import re
from collections import Counter

from otel_gpu.config import load
from otel_gpu.sample.library import Nvml
from otel_gpu.wiring import Service
from testkit.kubelet import FakeKubelet
from testkit.process import wait_until
from testkit.scenarios import Node, gpu_uuids, time_sliced_pods, write_scenario

GPUS, PODS = 512, 5000


def _per_gpu_families(body: str) -> dict[str, Counter]:
    per_gpu: dict[str, Counter] = {}
    for line in body.splitlines():
        match = re.match(r'([a-z_]+)\{.*\bhw_id="(GPU-[^"]+)"', line)
        if match:
            per_gpu.setdefault(match.group(2), Counter())[match.group(1)] += 1
    return per_gpu


def test_512_gpus_and_5000_pods_keep_every_series(fake_nvml, tmp_path):
    scenario = write_scenario(Node("gpus-512", GPUS), tmp_path)
    fake_nvml(scenario)
    uuids = gpu_uuids(scenario)
    kubelet = FakeKubelet(str(tmp_path / "kubelet.sock"))
    kubelet.set_pods(time_sliced_pods(uuids, PODS))
    kubelet.start()
    # a 20 s interval gives each GPU the longest read deadline (10 s): 512 reader threads
    # on a busy test machine are not a hung GPU, and this test counts every GPU's series
    config = load({"listen": "127.0.0.1:0", "kubelet_socket": str(kubelet.socket_path),
                   "kubelet_interval": "1h", "interval": "20s"}, environ={})
    service = Service(config, Nvml(), environ={})
    try:
        service.nvml.init()
        assert service.enricher is not None
        service.enricher.watcher.poll_once()
        service.pipeline.publish_sample(service.sampler.sample())
        cache = service.server.cache
        assert cache is not None

        def every_pod() -> str | None:
            service.pipeline.pods_changed()  # a rebuild for the pods may be due first
            body = cache.get().body.decode()
            return body if body.count("nvidia_gpu_k8s_allocation{") >= PODS else None

        body = wait_until(every_pod, 120, "5,000 allocation series")
    finally:
        service.server.server_close()
        service.telemetry.shutdown(0.5)
        service.sampler.close()
        kubelet.close()
    assert "otel_metric_overflow" not in body
    pods = re.findall(r'^nvidia_gpu_k8s_allocation\{.*k8s_pod_name="([^"]+)"', body, re.M)
    assert sorted(pods) == sorted(f"slice-{i}" for i in range(PODS))
    per_gpu = _per_gpu_families(body)
    assert len(per_gpu) == GPUS
    first = next(iter(per_gpu.values()))
    assert sum(first.values()) > 40  # the full set of a GPU's series, not a stub
    assert all(counts == first for counts in per_gpu.values())
