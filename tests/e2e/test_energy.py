"""Energy per pod: the real otel-gpu process, a fake kubelet and a fake node's files.

Three pods time-slice one GPU whose energy counter rises every sample; a fourth
holds another GPU whole. At every scrape the pods' energy and the unattributed
series add up to the device's own counter to the millijoule, and no series
goes down, also when one pod's process ends and the kubelet forgets the pod.
Over OTLP each pod's energy travels under its Resource; on a GPU in MIG mode
the energy is split across the instances by their GPM SM activity.
"""

from __future__ import annotations

import pytest

from otel_gpu.sim import load_scenario
from testkit.exposition import series
from testkit.kubelet import container, devices, pod
from testkit.process import start_on_node, wait_until

SHARED = "GPU-5a5a7118-e550-79a1-597e-7631e126c57a"
WHOLE = "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"
GIB = 1 << 30
ENDS_AFTER = 30
"""The sample after which train-b's process is gone."""

SCENARIO = f"""\
name: energy
devices:
  - name: NVIDIA A10
    uuid: {SHARED}
    memory: {{total: {24 * GIB}, used: {5 * GIB}}}
    utilization: {{gpu: 85, memory: 40}}
    fields: {{TOTAL_ENERGY_CONSUMPTION: {{start: 5000000000, step: 1234567}}}}
    processes:
      - {{pid: 101, used_memory: {GIB}, sm: 20}}
      - {{pid: 102, used_memory: {GIB}, sm: 30, until_sample: {ENDS_AFTER}}}
      - {{pid: 103, used_memory: {GIB}, sm: 25}}
      - {{pid: 104, used_memory: {GIB}, sm: 10}}
      - {{pid: 900, used_memory: {GIB}, sm: 5}}
  - name: NVIDIA A10
    uuid: {WHOLE}
    memory: {{total: {24 * GIB}, used: {2 * GIB}}}
    utilization: {{gpu: 70, memory: 20}}
    fields: {{TOTAL_ENERGY_CONSUMPTION: {{start: 7000000000, step: 2000001}}}}
    processes: [{{pid: 201, used_memory: {2 * GIB}, sm: 60}}]
node:
  host_pids: [900]
  pods:
    - {{namespace: ml, name: train-a, containers: [{{name: main, pids: [101]}}]}}
    - {{namespace: ml, name: train-b, containers: [{{name: main, pids: [102]}}]}}
    - {{namespace: media, name: encode-c, containers: [{{name: enc, pids: [103, 104]}}]}}
    - {{namespace: ml, name: solo-d, containers: [{{name: main, pids: [201]}}]}}
"""
SHARES = {("train-a", "ml", "main"): 0.20, ("train-b", "ml", "main"): 0.30,
          ("encode-c", "media", "enc"): 0.35}
IDLE = (None, None, None)
ENERGY = "nvidia_gpu_k8s_energy_joules_total"


def _pods(*names: str):
    replica = iter(range(len(SHARES)))
    sharers = [pod(name, container(c, devices("nvidia.com/gpu", f"{SHARED}::{next(replica)}")),
                   namespace=ns) for name, ns, c in SHARES if name in names]
    return [*sharers,
            pod("solo-d", container("main", devices("nvidia.com/gpu", WHOLE)), namespace="ml")]


def _start(collector, kubelet, tmp_path, env: dict | None = None):
    kubelet.set_pods(_pods(*(name for name, _, _ in SHARES)))
    return start_on_node(collector, tmp_path, kubelet, SCENARIO, env=env)


def _mj(joules: float) -> int:
    return round(joules * 1000)


def _parts(text: str, hw_id: str) -> dict[tuple, int]:
    """Each series' energy in mJ, by container (all None: the unattributed series)."""
    out = {}
    for labels, value in series(text, ENERGY, hw_id=hw_id):
        key = tuple(labels.get(k) or None
                    for k in ("k8s_pod_name", "k8s_namespace_name", "k8s_container_name"))
        assert key not in out, labels
        out[key] = _mj(value)
    return out


class Scrapes:
    """Reads /metrics and checks every body: the sum, and that nothing went down."""

    def __init__(self, proc) -> None:
        self.proc = proc
        self.highest: dict[tuple, int] = {}
        self.bodies: dict[int, dict[str, dict[tuple, int]]] = {}
        """sample number -> device -> parts, for bodies with energy series."""

    def scrape(self) -> int:
        text = self.proc.metrics()
        samples = series(text, "otel_gpu_samples_total")
        if not samples:
            return 0  # before the first sample
        ((_, seq),) = samples
        parts = {uuid: _parts(text, uuid) for uuid in (SHARED, WHOLE)}
        if not parts[SHARED]:
            return int(seq)  # before the kubelet's first answer
        for uuid, rows in parts.items():
            (device,) = [_mj(v) for _, v in series(text, "hw_energy_joules_total", hw_id=uuid)]
            assert sum(rows.values()) == device, (uuid, rows, device)
            for key, value in rows.items():
                assert value >= self.highest.get((uuid, key), 0), (uuid, key)
                self.highest[(uuid, key)] = value
        self.bodies[int(seq)] = parts
        return int(seq)

    def until(self, done, what: str, timeout: float = 60.0) -> None:
        wait_until(lambda: self.scrape() is not None and done(), timeout, what)


@pytest.mark.slow  # seconds of real time (retries, timeouts, many samples): not in the quick loop
def test_pods_energy_and_the_idle_series_add_up_to_the_gpus_counter(collector, kubelet,
                                                                      tmp_path):
    proc = _start(collector, kubelet, tmp_path)
    scrapes = Scrapes(proc)

    def sharers_seen(samples: int) -> bool:
        seen = [s for s, parts in scrapes.bodies.items() if set(SHARES) <= set(parts[SHARED])]
        return len(seen) >= samples

    scrapes.until(lambda: sharers_seen(6), "energy series of the three sharers in 6 samples")
    first = min(s for s, parts in scrapes.bodies.items() if set(SHARES) <= set(parts[SHARED]))
    # train-b's process ends, then the kubelet forgets train-b
    scrapes.until(lambda: max(scrapes.bodies) > ENDS_AFTER + 1, f"sample {ENDS_AFTER + 2}")
    kubelet.set_pods(_pods("train-a", "encode-c"))

    def forgotten():
        text = proc.metrics()
        return not series(text, "nvidia_gpu_k8s_allocation", k8s_pod_name="train-b")

    wait_until(forgotten, 20, "the kubelet's answer without train-b")
    after = max(scrapes.bodies)
    scrapes.until(lambda: max(scrapes.bodies) >= after + 4, "4 more samples")

    last = scrapes.bodies[max(scrapes.bodies)][SHARED]
    start = scrapes.bodies[first][SHARED]
    device = sum(last.values()) - sum(start.values())
    assert device >= 5 * 1234567
    # each running pod's part of the increase is its processes' share of SM time
    for key in (("train-a", "ml", "main"), ("encode-c", "media", "enc")):
        assert (last[key] - start[key]) / device == pytest.approx(SHARES[key], rel=1e-3), key
    # the idle 15 % and the host process's 5 % (and train-b's 30 % once it ended) are nobody's
    assert last[IDLE] - start[IDLE] > 0.2 * device
    # train-b ended: its series stays, at its final total
    ended = [parts[SHARED][("train-b", "ml", "main")]
             for s, parts in scrapes.bodies.items() if s > ENDS_AFTER + 1]
    assert ended and len(set(ended)) == 1 and ended[0] > 0

    # the GPU held whole: everything since the first split is its pod's
    whole = scrapes.bodies[max(scrapes.bodies)][WHOLE]
    assert set(whole) == {("solo-d", "ml", "main"), IDLE}
    assert whole[IDLE] >= 7_000_000_000  # before the collector started, or before the pods
    text = proc.metrics()
    rules = {lab["hw_id"]: lab["nvidia_gpu_energy_rule"]
             for lab, value in series(text, "nvidia_gpu_k8s_energy_rule") if value == 1}
    assert rules == {SHARED: "sm_share", WHOLE: "exclusive"}


def test_each_pods_energy_travels_under_its_resource(collector, kubelet, receiver, tmp_path):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
    _start(collector, kubelet, tmp_path, env=env)

    def energy(req) -> dict[tuple, object]:
        out = {}
        for row in req.rows():
            if row.metric == "nvidia.gpu.k8s.energy" and row.attributes["hw.id"] == SHARED:
                owner = tuple(row.resource.get(k) for k in
                              ("k8s.pod.name", "k8s.namespace.name", "k8s.container.name"))
                out[owner] = row
        return out

    def every_pod_used_some(req) -> bool:
        rows = energy(req)
        return set(SHARES) <= set(rows) and all(rows[k].value > 0 for k in SHARES)

    (req,) = receiver.wait_for(every_pod_used_some, timeout=30)
    rows = energy(req)
    assert set(rows) == {*SHARES, IDLE}
    for row in rows.values():
        assert row.kind == "sum" and row.monotonic and row.unit == "J"
        assert not {"k8s.pod.name", "k8s.namespace.name"} & set(row.attributes), row
    assert rows[IDLE].attributes["nvidia.gpu.process.owner"] == "unattributed"
    assert "k8s.pod.name" not in rows[IDLE].resource  # the node's Resource


MIG_SCENARIO = """\
name: energy-mig
devices:
  - name: NVIDIA H100 80GB HBM3
    memory: {total: 85520809984}
    fields: {TOTAL_ENERGY_CONSUMPTION: {start: 9000000000, step: 1000000}}
    gpm: {SM_UTIL: 60}
    mig:
      - {profile: 3g.40gb, gpu_instance_id: 2, memory: {total: 42949672960}, gpm: {SM_UTIL: 50}}
      - {profile: 1g.10gb, gpu_instance_id: 9, memory: {total: 10737418240}, gpm: {SM_UTIL: 100}}
"""


def test_a_mig_gpus_energy_is_split_by_instance_activity(collector, kubelet, tmp_path):
    path = tmp_path / "mig.yaml"
    path.write_text(MIG_SCENARIO)
    (gpu,) = load_scenario(str(path)).devices
    big, small = (m.uuid for m in gpu.mig)
    kubelet.set_pods([
        pod("big", container("main", devices("nvidia.com/mig-3g.40gb", big)), namespace="ml"),
        pod("small", container("main", devices("nvidia.com/mig-1g.10gb", small)),
            namespace="ml"),
    ])
    proc = collector("--simulate", str(path), "--kubelet-socket", kubelet.socket_path,
                     "--kubelet-interval", "0.1")
    bodies: dict[int, dict[tuple, int]] = {}

    def scrape() -> bool:
        text = proc.metrics()
        parts = {(lab["hw_id"], lab.get("k8s_pod_name") or None): _mj(v)
                 for lab, v in series(text, ENERGY)}
        if not parts:
            return False  # before the kubelet's first answer
        (device,) = [_mj(v) for _, v in series(text, "hw_energy_joules_total", hw_id=gpu.uuid)]
        assert sum(parts.values()) == device  # the parent's counter, instances included
        rules = {lab["hw_id"]: lab["nvidia_gpu_energy_rule"]
                 for lab, _ in series(text, "nvidia_gpu_k8s_energy_rule")}
        if rules.get(gpu.uuid) != "mig_activity":
            return False  # a sample without GPM values is split by slices
        if "unattributed" in (rules.get(big), rules.get(small)):
            return False  # a sample taken before the kubelet's first answer
        assert rules == {gpu.uuid: "mig_activity", big: "exclusive", small: "exclusive"}
        ((_, seq),) = series(text, "otel_gpu_samples_total")
        bodies[int(seq)] = parts
        return len(bodies) >= 4

    wait_until(scrape, 30, "4 samples split by MIG activity")
    first, last = bodies[min(bodies)], bodies[max(bodies)]
    grown = {key: last[key] - first[key] for key in last}
    # 50 % of 3 slices against 100 % of 1: 3 to 2, all of the increase to the instances
    assert grown[(big, "big")] == 600_000 * (max(bodies) - min(bodies)) > 0
    assert grown[(small, "small")] == 400_000 * (max(bodies) - min(bodies))
    assert grown[(gpu.uuid, None)] == 0
