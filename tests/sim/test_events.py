"""XID events: registration, delivery once per event set, and waiting."""

from __future__ import annotations

import pynvml
import pytest

from tests.sim.helpers import FAULTS, handles, next_sample, token


def test_xid_events_are_delivered_once_then_timeout(nvml):
    nvml(FAULTS)
    hs = handles()
    event_set = pynvml.nvmlEventSetCreate()
    for h in hs:
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
    next_sample()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    next_sample()
    next_sample()  # sample 3: GPU 0's sample-2 XID and GPU 1's sample-3 XID are due
    got = []
    for _ in range(2):
        data = pynvml.nvmlEventSetWait_v2(event_set, 0)
        assert data.eventType == pynvml.nvmlEventTypeXidCriticalError
        # GPU 1 is lost by now (lost_after: 2), so match the handle, don't query it
        got.append((hs.index(next(h for h in hs if token(h) == token(data.device))),
                    data.eventData, data.gpuInstanceId))
    assert got == [(0, 79, 0xFFFFFFFF), (1, 79, 0xFFFFFFFF)]
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    next_sample()
    assert pynvml.nvmlEventSetWait_v2(event_set, 0).eventData == 48
    pynvml.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(event_set, 0)


def test_events_need_registration_and_each_set_gets_its_own_copy(nvml):
    nvml(FAULTS)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    unregistered, first, second = (pynvml.nvmlEventSetCreate() for _ in range(3))
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, first)
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, second)
    next_sample()
    next_sample()
    assert pynvml.nvmlEventSetWait_v2(first, 0).eventData == 79
    assert pynvml.nvmlEventSetWait_v2(second, 0).eventData == 79
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(unregistered, 0)


def test_events_from_before_registration_are_not_delivered(nvml):
    nvml(FAULTS)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for _ in range(3):
        next_sample()
    late = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, late)
    with pytest.raises(pynvml.NVMLError_Timeout):  # the sample-2 XID happened before
        pynvml.nvmlEventSetWait_v2(late, 0)
    next_sample()
    assert pynvml.nvmlEventSetWait_v2(late, 0).eventData == 48


def test_event_wait_blocks_through_the_injected_sleep(nvml):
    slept: list[float] = []
    nvml(FAULTS, sleep=slept.append)
    event_set = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 250)
    assert slept == [0.25]


def test_events_on_a_mig_handle_are_not_supported(nvml):
    nvml("a100-mig")
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(mig, pynvml.nvmlEventTypeXidCriticalError,
                                        pynvml.nvmlEventSetCreate())
