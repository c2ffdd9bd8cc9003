"""The fake's NVLink: link states, fields whose scope is a link id, and error counters."""

from __future__ import annotations

import pynvml
import pytest

from otel_gpu.sim import ScenarioError, load_scenario
from tests.sim.helpers import THREE_LINKS, handles, next_sample, write

ALL_LINKS = 0xFFFFFFFF
TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX

def _fields(handle, *requests):
    return [(e.nvmlReturn, e.value.ullVal) for e in pynvml.nvmlDeviceGetFieldValues(
        handle, list(requests))]


def test_link_states_follow_the_scenario(nvml, tmp_path):
    nvml(write(tmp_path, THREE_LINKS))
    h = handles()[0]
    next_sample()
    assert [pynvml.nvmlDeviceGetNvLinkState(h, link) for link in range(4)] == [1, 1, 0, 1]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # past the last link
        pynvml.nvmlDeviceGetNvLinkState(h, 4)
    next_sample()  # sample 2: link 3 went down after sample 1
    assert pynvml.nvmlDeviceGetNvLinkState(h, 3) == 0


def test_the_data_fields_scope_is_the_link_and_uint_max_is_every_link(nvml, tmp_path):
    nvml(write(tmp_path, THREE_LINKS))
    h0, h1 = handles()
    next_sample()
    assert _fields(h0, (TX, 0), (TX, 1), (TX, 2), (TX, 3), (TX, ALL_LINKS)) == [
        (0, 1000), (0, 20000), (0, 300000), (0, 4000000), (0, 4321000)]
    assert _fields(h1, (TX, 0), (RX, 1), (RX, ALL_LINKS)) == [(0, 1100), (0, 70), (0, 77)]
    assert _fields(h0, (TX, 4)) == [(pynvml.NVML_ERROR_INVALID_ARGUMENT, 0)]
    next_sample()
    assert _fields(h0, (TX, 0)) == [(0, 1010)]
    # a plain id is scope 0: link 0 alone, not the total
    assert pynvml.nvmlDeviceGetFieldValues(h0, [TX])[0].value.ullVal == 1010


def test_the_error_totals_sum_every_link(nvml, tmp_path):
    nvml(write(tmp_path, THREE_LINKS))
    h0, h1 = handles()
    next_sample()
    ids = [pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
           pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
           pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
           pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL]
    assert [v for _, v in _fields(h0, *ids)] == [5, 5, 1, 4]
    assert [v for _, v in _fields(h1, *ids)] == [6, 5, 1, 4]
    counters = [pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
                pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY]
    per_link = [[pynvml.nvmlDeviceGetNvLinkErrorCounter(h1, link, c) for c in counters]
                for link in range(4)]
    assert per_link == [[2, 0, 1, 0], [4, 0, 0, 4], [0, 5, 0, 0], [0, 0, 0, 0]]


def test_without_the_all_links_scope_only_single_links_answer(nvml, tmp_path):
    nvml(write(tmp_path, """
devices:
  - name: NVIDIA V100-SXM2-32GB
    nvlink: {all_links_scope: false, links: [{tx: 11}, {tx: 22}]}
"""))
    h = handles()[0]
    next_sample()
    assert _fields(h, (TX, ALL_LINKS), (TX, 1)) == [
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, 0), (0, 22)]


def test_no_nvlink_is_not_supported(nvml):
    nvml("t4")
    h = handles()[0]
    next_sample()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(h, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
    assert _fields(h, (TX, ALL_LINKS)) == [(pynvml.NVML_ERROR_NOT_SUPPORTED, 0)]


def test_nvlink_on_a_mig_handle_is_not_supported(nvml):
    nvml("a100-mig")
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handles()[0], 0)
    next_sample()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(mig, 0)
    assert _fields(mig, (TX, ALL_LINKS)) == [(pynvml.NVML_ERROR_NOT_SUPPORTED, 0)]


def test_profiles_links(nvml):
    nvml("h100x8")
    hs = handles()
    next_sample()
    for h in hs:
        assert [pynvml.nvmlDeviceGetNvLinkState(h, link) for link in range(18)] == [1] * 18
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkState(h, 18)
    per_link = [v for _, v in _fields(hs[1], *((TX, link) for link in range(18)))]
    assert len(set(per_link)) == 18  # every link moves its own traffic
    assert per_link[0] == 105_000_000 and per_link[17] == 122_000_000
    assert _fields(hs[1], (TX, ALL_LINKS)) == [(0, sum(per_link))]


def test_nvlink_scenario_checks(tmp_path):
    base = "devices:\n  - name: G\n"
    bad = {
        "    nvlink: {links: [{state: up}]}\n": "expected active or inactive",
        "    nvlink: {links: [{tx: -1}]}\n": "non-negative",
        "    nvlink: {links: [{speed: 1}]}\n": "unknown key",
        "    nvlink: {}\n": "missing required key 'links'",
        "    nvlink: {links: [{}], all_links_scope: 1}\n": "expected true or false",
        "    nvlink: {links: [" + "{}, " * 37 + "{}]}\n": "at most 36 links",
        "    fields: {NVLINK_THROUGHPUT_DATA_TX: 5}\n    nvlink: {links: [{}]}\n":
            r"devices\[0\]\.fields\.NVLINK_THROUGHPUT_DATA_TX: an NVLink field is given per link",
    }
    for text, message in bad.items():
        with pytest.raises(ScenarioError, match=message):
            load_scenario(write(tmp_path, base + text))
