"""The NVLink link states in the batched field call, and the call per link they replace."""

from __future__ import annotations

import logging

import pynvml
import pytest

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from tests.support.drivers import LinkTwoComesUp, NoStateField, Recording, StatesSayInactive
from tests.support.nvml import LINKS, SOURCES

STATE = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
NVLINK = ("nvlink.links", "nvlink.active", "nvlink.tx", "nvlink.rx", "nvlink.errors.crc_flit")


def _run(fake_nvml, driver: type[Recording], samples: int, scope: str = "false"):
    lib = fake_nvml(LINKS.format(all_links_scope=scope), driver=driver)
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES)
    seen = [{k: v for k, v in sampler.sample().devices[0].values.items() if k in NVLINK}
            for _ in range(samples)]
    sampler.close()
    return lib, seen


def test_the_states_come_in_the_batch_after_the_first_read(fake_nvml):
    lib, seen = _run(fake_nvml, Recording, 4)
    assert lib.calls["nvmlDeviceGetNvLinkState"] == 4 + 1  # four links and the end, once
    assert lib.calls["nvmlDeviceGetFieldValues"] == 4
    for request in lib.requests:  # compared on the first read, then relied on
        assert sorted(p for p in request if p[0] == STATE) == [(STATE, k) for k in range(4)]
    assert [v["nvlink.links"] for v in seen] == [3, 3, 2, 2]  # link 3 is down from sample 3
    assert [v["nvlink.active"] for v in seen] == [0b1011, 0b1011, 0b0011, 0b0011]
    assert [v["nvlink.tx"] for v in seen] == [
        1000 + 20000 + 4000000, 1010 + 20000 + 4000000, 1020 + 20000, 1030 + 20000]


@pytest.mark.parametrize("scope", ["true", "false"])
@pytest.mark.parametrize("driver", [StatesSayInactive, NoStateField])
def test_a_driver_without_the_same_states_in_the_batch_is_asked_per_link(
        fake_nvml, caplog, driver, scope):
    caplog.set_level(logging.DEBUG, logger="otel_gpu")
    lib, seen = _run(fake_nvml, driver, 4, scope)
    _, batched = _run(fake_nvml, Recording, 4, scope)
    assert seen == batched  # the same values either way
    assert lib.calls["nvmlDeviceGetNvLinkState"] == 4 * 5  # every read
    assert not any(p[0] == STATE for request in lib.requests[1:] for p in request)
    said = [r for r in caplog.records if "do not match" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.DEBUG  # once, over four reads


def test_a_link_that_comes_up_is_summed_from_the_next_read_never_undercounted(fake_nvml):
    lib, seen = _run(fake_nvml, LinkTwoComesUp, 4)
    # sample 3: link 3 went down and link 2 came up; link 2 was not asked for
    assert seen[2]["nvlink.active"] == 0b0111 and "nvlink.tx" not in seen[2]
    assert "nvlink.errors.crc_flit" in seen[2]  # a total the driver keeps: still there
    assert sorted(p for p in lib.requests[3] if p[0] == TX) == [(TX, 0), (TX, 1), (TX, 2)]
    assert seen[3]["nvlink.tx"] == 1030 + 20000 + 300000
