"""GPM profiling through the fake: support, sample buffers, samples and metrics, via pynvml."""

from __future__ import annotations

import pynvml
import pytest

from otel_gpu.sim import ScenarioError, load_scenario
from tests.sim.helpers import next_sample, write

SM = pynvml.NVML_GPM_METRIC_SM_UTIL
TENSOR = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
DRAM = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
PCIE_TX = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC

HOPPER = """
devices:
  - name: NVIDIA H100 80GB HBM3
    count: 2
    gpm:
      SM_UTIL: {start: 40, per_device: 10, step: 1}
      ANY_TENSOR_UTIL: 25.5
      PCIE_TX_PER_SEC: [1000, 2000]
  - name: NVIDIA A100-SXM4-40GB
  - name: NVIDIA H100 80GB HBM3
    gpm: {SM_UTIL: 50, busy: {from_sample: 5, until_sample: 6}}
    mig:
      - {profile: 3g.40gb, gpu_instance_id: 2, gpm: {SM_UTIL: 70, DRAM_BW_UTIL: 35}}
      - {profile: 1g.10gb, gpu_instance_id: 9}
  - name: NVIDIA H100 80GB HBM3
    gpm: {unsupported: true}
  - name: NVIDIA H100 80GB HBM3
    gpm: {SM_UTIL: 1, no_permission: true}
"""


def metrics(first, second, ids):
    """``nvmlGpmMetricsGet`` over two buffers: [(return code, value)] per id."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate(ids):
        request.metrics[i].metricId = metric
    pynvml.nvmlGpmMetricsGet(request)
    return [(request.metrics[i].nvmlReturn, request.metrics[i].value) for i in range(len(ids))]


@pytest.fixture
def hopper(nvml):
    lib = nvml(HOPPER)
    next_sample()
    return lib, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(6)]


def test_support_is_hopper_with_gpm(hopper):
    _, gpus = hopper
    supported = [pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice for h in gpus]
    assert supported == [1, 1, 0, 1, 0, 1]
    buffer = pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(gpus[0], buffer)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # before Hopper
        pynvml.nvmlGpmSampleGet(gpus[2], buffer)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # unsupported: true
        pynvml.nvmlGpmSampleGet(gpus[4], buffer)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlGpmSampleGet(gpus[5], buffer)


def test_metrics_between_two_samples_are_the_scenarios_at_the_later_one(hopper):
    _, gpus = hopper
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(gpus[1], first)  # sample 1
    next_sample()
    next_sample()
    pynvml.nvmlGpmSampleGet(gpus[1], second)  # sample 3
    # 40 + 10 (second GPU of its entry) + 1 * (3 - 1); the list's element for sample 3
    assert metrics(first, second, [SM, TENSOR, PCIE_TX, DRAM]) == [
        (pynvml.NVML_SUCCESS, 52.0), (pynvml.NVML_SUCCESS, 25.5), (pynvml.NVML_SUCCESS, 1000.0),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0),
    ]
    # the later sample decides, whichever buffer comes first
    assert metrics(second, first, [SM]) == [(pynvml.NVML_SUCCESS, 52.0)]
    next_sample()
    pynvml.nvmlGpmSampleGet(gpus[1], first)  # sample 4, into the older buffer
    assert metrics(second, first, [SM, PCIE_TX]) == [
        (pynvml.NVML_SUCCESS, 53.0), (pynvml.NVML_SUCCESS, 2000.0)]


def test_mig_samples_are_per_gpu_instance(hopper):
    _, gpus = hopper
    parent = gpus[3]
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmMigSampleGet(parent, 2, first)
    next_sample()
    pynvml.nvmlGpmMigSampleGet(parent, 2, second)
    assert metrics(first, second, [SM, DRAM]) == [
        (pynvml.NVML_SUCCESS, 70.0), (pynvml.NVML_SUCCESS, 35.0)]
    # an instance without gpm: the GPU samples it, no metric answers
    pynvml.nvmlGpmMigSampleGet(parent, 9, first)
    next_sample()
    pynvml.nvmlGpmMigSampleGet(parent, 9, second)
    assert metrics(first, second, [SM]) == [(pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpmMigSampleGet(parent, 5, first)
    # a MIG handle is not where device samples are taken
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(mig, first)
    # two buffers of different devices (instance 9's and the GPU's) give no metrics
    pynvml.nvmlGpmSampleGet(gpus[0], first)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        metrics(first, second, [SM])


def test_busy_counters_answer_in_use_for_the_window_on_the_gpu_and_its_instances(nvml):
    nvml(HOPPER)
    parent = pynvml.nvmlDeviceGetHandleByIndex(3)
    buffer = pynvml.nvmlGpmSampleAlloc()

    def outcome(take, *args):
        try:
            take(parent, *args, buffer)
        except pynvml.NVMLError as exc:
            return exc.value
        return "ok"

    seen = []
    for _ in range(7):
        next_sample()
        seen.append([outcome(pynvml.nvmlGpmSampleGet), outcome(pynvml.nvmlGpmMigSampleGet, 2)])
    in_use = pynvml.NVML_ERROR_IN_USE
    assert seen == [["ok", "ok"]] * 4 + [[in_use, in_use]] * 2 + [["ok", "ok"]]


def test_buffers_are_counted_until_freed(hopper):
    lib, gpus = hopper
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    assert lib.gpm_buffers == 2
    # buffers never filled give no metrics
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        metrics(first, second, [SM])
    pynvml.nvmlGpmSampleFree(first)
    assert lib.gpm_buffers == 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleFree(first)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleGet(gpus[0], first)
    pynvml.nvmlGpmSampleFree(second)
    assert lib.gpm_buffers == 0
    assert lib.calls["nvmlGpmSampleAlloc"] == 2 and lib.calls["nvmlGpmSampleFree"] == 3


def test_the_built_in_profiles_h100_has_gpm_and_a100_has_not(nvml):
    nvml("h100x8")
    next_sample()
    values = []
    for index in (0, 3, 4, 7):
        gpu = pynvml.nvmlDeviceGetHandleByIndex(index)
        assert pynvml.nvmlGpmQueryDeviceSupport(gpu).isSupportedDevice == 1
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(gpu, first)
        pynvml.nvmlGpmSampleGet(gpu, second)
        values.append([v for _, v in metrics(first, second, [SM, TENSOR, DRAM])])
    assert values == [[20.0, 10.0, 18.0], [50.0, 28.0, 39.0], [60.0, 40.0, 46.0],
                      [90.0, 58.0, 67.0]]


def test_a100_mig_profile_has_no_gpm(nvml):
    nvml("a100-mig")
    next_sample()
    for index in range(3):
        gpu = pynvml.nvmlDeviceGetHandleByIndex(index)
        assert pynvml.nvmlGpmQueryDeviceSupport(gpu).isSupportedDevice == 0


@pytest.mark.parametrize(("gpm", "where", "message"), [
    ("{SM_UTILISATION: 3}", "devices[0].gpm.SM_UTILISATION",
     "unknown key (expected a pynvml NVML_GPM_METRIC_<NAME>"),
    ("{SM_UTIL: 3, 2: 4}", "devices[0].gpm.2", "GPM metric 2 is listed twice"),
    ("{SM_UTIL: -1}", "devices[0].gpm.SM_UTIL", "expected a non-negative number"),
    ("{busy: sometimes}", "devices[0].gpm.busy", "expected true or false"),
    ("{busy: {from: 2}}", "devices[0].gpm.busy.from", "unknown key"),
    ("[SM_UTIL]", "devices[0].gpm", "expected a mapping of GPM metric name to value"),
    ("{MAX: 1}", "devices[0].gpm.MAX", "unknown key"),
])
def test_bad_gpm_keys_name_their_path(tmp_path, gpm, where, message):
    path = write(tmp_path, f"devices:\n  - name: NVIDIA H100\n    gpm: {gpm}\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert f": {where}: " in str(info.value) and message in str(info.value)


def test_a_mig_instance_cannot_be_unsupported_on_its_own(tmp_path):
    path = write(tmp_path, "devices:\n  - name: NVIDIA H100\n    gpm: {SM_UTIL: 1}\n"
                           "    mig: [{profile: 1g.10gb, gpu_instance_id: 9,\n"
                           "           gpm: {unsupported: true}}]\n")
    with pytest.raises(ScenarioError, match=r"devices\[0\]\.mig\[0\]\.gpm\.unsupported: unknown"):
        load_scenario(path)


@pytest.mark.parametrize(("gpu", "where"), [
    ("", "devices[0].mig[0].gpm"),                       # a GPU before Hopper
    ("    gpm: {unsupported: true}\n", "devices[0].mig[0].gpm"),
    ("    gpm: {SM_UTIL: 1, unsupported: true}\n", "devices[0].gpm"),
])
def test_gpm_values_that_would_never_be_read_are_refused(tmp_path, gpu, where):
    # the demo's MIG instances once had GPM values on a GPU without GPM: silently unused
    path = write(tmp_path, "devices:\n  - name: NVIDIA H100\n" + gpu +
                           "    mig: [{profile: 3g.40gb, gpu_instance_id: 1,\n"
                           "           gpm: {SM_UTIL: 70}}]\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert f": {where}: " in message and "never read" in message
    assert "\n" not in message
