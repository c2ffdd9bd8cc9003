"""The sampler's NVLink sums, the PCIe fallback, static readers and the new health values."""

from __future__ import annotations

import logging

import pynvml
import pytest

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.snapshot import DEGRADED, OK
from tests.support.drivers import Recording
from tests.support.nvml import LINKS, SOURCES

ALL_LINKS = 0xFFFFFFFF
TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
STATE = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
NVLINK_KEYS = {"nvlink.links", "nvlink.active", "nvlink.tx", "nvlink.rx",
               "nvlink.errors.crc_flit", "nvlink.errors.crc_data", "nvlink.errors.replay",
               "nvlink.errors.recovery"}


@pytest.fixture
def sampler(fake_nvml):
    """sampler(yaml) -> (Recording driver, Sampler)."""

    def make(spec: str):
        lib = fake_nvml(spec, driver=Recording)
        nvml = Nvml()
        nvml.init()
        return lib, Sampler(nvml, SOURCES)

    return make


def _link_requests(pairs):
    return sorted(p for p in pairs if p[0] == TX)


def test_nvlink_traffic_is_every_links_total_not_link_0s(sampler):
    lib, s = sampler(LINKS.format(all_links_scope="true"))
    values = s.sample().devices[0].values
    # the driver's all-links total (inactive links included, as the driver counts them)
    assert values["nvlink.tx"] == 1000 + 20000 + 300000 + 4000000
    assert values["nvlink.rx"] == 7 + 70 + 700 + 7000
    # asked for both ways once; the total answered, so only the total from then on
    assert _link_requests(lib.requests[0]) == [(TX, 0), (TX, 1), (TX, 3), (TX, ALL_LINKS)]
    values = s.sample().devices[0].values
    assert _link_requests(lib.requests[1]) == [(TX, ALL_LINKS)]
    assert values["nvlink.tx"] == 1010 + 20000 + 300000 + 4000000


def test_without_the_all_links_scope_the_active_links_are_summed(sampler):
    lib, s = sampler(LINKS.format(all_links_scope="false"))
    values = s.sample().devices[0].values
    assert values["nvlink.tx"] == 1000 + 20000 + 4000000  # links 0, 1 and 3: the active ones
    assert values["nvlink.rx"] == 7 + 70 + 7000
    assert _link_requests(lib.requests[0]) == [(TX, 0), (TX, 1), (TX, 3), (TX, ALL_LINKS)]
    s.sample()
    assert _link_requests(lib.requests[1]) == [(TX, 0), (TX, 1), (TX, 3)]
    values = s.sample().devices[0].values  # sample 3: link 3 is down
    # asked for the links active at the last read (the states come in the same call),
    # summed over those active now
    assert _link_requests(lib.requests[2]) == [(TX, 0), (TX, 1), (TX, 3)]
    assert values["nvlink.tx"] == 1020 + 20000
    assert values["nvlink.links"] == 2
    s.sample()
    assert _link_requests(lib.requests[3]) == [(TX, 0), (TX, 1)]


def test_links_up_and_error_totals(sampler):
    lib, s = sampler(LINKS.format(all_links_scope="true"))
    values = s.sample().devices[0].values
    assert values["nvlink.links"] == 3
    assert values["nvlink.active"] == 0b1011
    assert [values[f"nvlink.errors.{k}"] for k in ("crc_flit", "crc_data", "replay",
                                                  "recovery")] == [5, 5, 1, 4]
    s.sample()
    assert s.sample().devices[0].values["nvlink.links"] == 2


def test_a_link_that_does_not_answer_omits_the_sum_rather_than_undercount(sampler, caplog):
    lib, s = sampler(LINKS.format(all_links_scope="false"))
    Recording.failing = {(TX, 1)}
    try:
        with caplog.at_level(logging.WARNING):
            values = s.sample().devices[0].values
    finally:
        Recording.failing = set()
    assert "nvlink.tx" not in values and values["nvlink.rx"] == 7077
    assert "reading nvlink.tx failed" in caplog.text
    assert s.sample().devices[0].values["nvlink.tx"] == 1010 + 20000 + 4000000


def test_a_gpu_without_nvlink_has_no_nvlink_values_and_is_asked_once(sampler):
    lib, s = sampler("""
devices:
  - name: Tesla T4
    fields: {NVLINK_THROUGHPUT_DATA_TX: 5, NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 0}
""")
    for _ in range(3):
        values = s.sample().devices[0].values
        assert not NVLINK_KEYS & set(values)
    assert lib.calls["nvmlDeviceGetNvLinkState"] == 1
    assert all(fid not in (TX, RX) for req in lib.requests for fid, _ in req)


def test_all_links_down_is_no_nvlink_not_zero(sampler):
    lib, s = sampler("""
devices:
  - name: NVIDIA H100 PCIe
    nvlink: {links: [{state: inactive, tx: 9, crc_flit: 1}, {state: inactive}]}
""")
    for _ in range(2):
        values = s.sample().devices[0].values
        assert not NVLINK_KEYS & set(values)
    # two links and the end, on the first read; the batch gives the states from then on
    assert lib.calls["nvmlDeviceGetNvLinkState"] == 3
    assert [p for p in lib.requests[1] if p[0] == STATE] == [(STATE, 0), (STATE, 1)]
    assert all(fid != TX for req in lib.requests for fid, _ in req)


def test_mig_instances_have_no_nvlink(sampler):
    lib, s = sampler("a100-mig")
    snap = s.sample()
    for sample in snap.devices:
        keys = set(sample.values)
        if sample.device.is_mig:
            assert not NVLINK_KEYS & keys
        else:
            assert sample.values["nvlink.links"] == 12


def test_pcie_throughput_is_read_only_without_the_byte_counters(sampler):
    lib, s = sampler("""
devices:
  - name: NVIDIA A10
    fields: {PCIE_COUNT_TX_BYTES: 100, PCIE_COUNT_RX_BYTES: 200}
    pcie: {tx_throughput: 1, rx_throughput: 2}
  - name: Tesla T4
    pcie: {tx_throughput: 1200, rx_throughput: {start: 45000, step: 5}}
""")
    for n in range(2):
        with_counters, without = s.sample().devices
        assert with_counters.values["pcie.tx"] == 100
        assert "pcie.throughput.tx" not in with_counters.values
        assert without.values["pcie.throughput.tx"] == 1200
        assert without.values["pcie.throughput.rx"] == 45000 + 5 * n
    assert lib.calls["nvmlDeviceGetPcieThroughput"] == 2 * 2  # the T4 only, TX and RX


STATIC = """
devices:
  - name: NVIDIA L4
    count: 2
    max_clocks: {graphics: 2040, sm: 2040, memory: 6251, video: 1770}
    power_limits: {current: {start: 72000, step: -1000}, enforced: 72000, default: 72000,
                   min: 40000, max: 72000}
    pcie: {generation: {start: 4, step: -1}, max_generation: 4, width: 16, max_width: 16}
    performance_state: [0, 32, 8]
"""


OLDER_DRIVER = ("    unsupported: [POWER_REQUESTED_LIMIT, POWER_CURRENT_LIMIT, POWER_DEFAULT_LIMIT,"
                " POWER_MIN_LIMIT, POWER_MAX_LIMIT]\n")
"""A driver without the power limit field ids: each limit is read with its own call."""


def test_static_values_are_read_once_and_the_others_every_sample(sampler):
    lib, s = sampler(STATIC + OLDER_DRIVER)
    seen = [s.sample().devices[1].values for _ in range(3)]
    assert lib.calls["nvmlDeviceGetMaxClockInfo"] == 2 * 4
    assert lib.calls["nvmlDeviceGetPowerManagementDefaultLimit"] == 2
    assert lib.calls["nvmlDeviceGetPowerManagementLimitConstraints"] == 2
    assert lib.calls["nvmlDeviceGetMaxPcieLinkGeneration"] == 2
    assert lib.calls["nvmlDeviceGetMaxPcieLinkWidth"] == 2
    assert lib.calls["nvmlDeviceGetPowerManagementLimit"] == 2 * 3
    assert lib.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 2 * 3
    assert [v["power.limit.current"] for v in seen] == [72000, 71000, 70000]
    assert [v["pcie.link.gen"] for v in seen] == [4, 3, 2]
    for v in seen:  # the static ones keep being reported
        assert (v["clock.max.video"], v["power.limit.min"], v["pcie.link.width.max"]) == (
            1770, 40000, 16)


def test_power_limits_cost_no_call_of_their_own_where_the_batch_answers_them(sampler):
    lib, s = sampler(STATIC)
    seen = [s.sample().devices[1].values for _ in range(3)]
    for symbol in ("nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEnforcedPowerLimit",
                   "nvmlDeviceGetPowerManagementDefaultLimit",
                   "nvmlDeviceGetPowerManagementLimitConstraints"):
        assert lib.calls[symbol] == 0, symbol
    assert lib.calls["nvmlDeviceGetFieldValues"] == 2 * 3
    assert [v["power.limit.current"] for v in seen] == [72000, 71000, 70000]
    for v in seen:
        assert (v["power.limit.enforced"], v["power.limit.default"], v["power.limit.min"],
                v["power.limit.max"]) == (72000, 72000, 40000, 72000)


def test_an_unknown_performance_state_is_omitted(sampler):
    lib, s = sampler(STATIC)
    assert [s.sample().devices[0].values.get("pstate") for _ in range(3)] == [0, None, 8]


def test_a_pending_page_retirement_degrades_the_gpu(sampler):
    lib, s = sampler("""
devices:
  - name: Tesla V100
    fields: {RETIRED_SBE: 2, RETIRED_DBE: 1, RETIRED_PENDING: [0, 1]}
""")
    first, second = s.sample().devices[0], s.sample().devices[0]
    assert (first.state, second.state) == (OK, DEGRADED)
    assert (second.values["retired.sbe"], second.values["retired.dbe"]) == (2, 1)


def test_profiles(sampler):
    lib, s = sampler("t4")
    t4 = s.sample().devices
    assert [d.values["pcie.throughput.rx"] for d in t4] == [45000, 60500]
    assert [d.values["retired.sbe"] + d.values["retired.dbe"] for d in t4] == [1, 3]
    assert not any(NVLINK_KEYS & set(d.values) for d in t4)
    lib, s = sampler("h100x8")
    h100 = s.sample().devices
    assert [d.values["nvlink.links"] for d in h100] == [18] * 8
    assert [d.values["nvlink.tx"] for d in h100] == [
        1_953_000_000 + 90_000_000 * k for k in range(4)] + [
        2_313_000_000 + 90_000_000 * k for k in range(4)]
