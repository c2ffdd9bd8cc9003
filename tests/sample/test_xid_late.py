"""An XID event drained is an event counted, however late the drain finishes.

The drain of the event set is a job under the read deadline; one that finishes
after it has taken its events out of the driver, so the next sample must count
them, and a wait that never returns must still hold no GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sim.driver.shapes import Hang
from testkit.process import wait_until
from tests.support.nvml import SOURCES, sample_within

THE_WAIT = "the hung event wait"
"""What a sample must not wait on."""

XIDS = ", ".join(["{sample: 1, code: 79}"] * 5 + ["{sample: 1, code: 48}"])
SCENARIO = f"""
devices:
  - name: NVIDIA H100 80GB HBM3
    memory: {{total: 1000, used: 10}}
    power: {{start: 100000, step: 1000}}
    xid: [{XIDS}]
  - name: NVIDIA H100 80GB HBM3
    memory: {{total: 1000, used: 10}}
    power: {{start: 100000, step: 1000}}
"""


@pytest.fixture
def late(fake_nvml) -> Iterator[tuple[Sampler, Hang]]:
    """A sampler over two GPUs whose event waits block until the test releases them."""
    lib = fake_nvml(SCENARIO)
    hang = Hang()
    lib.answer_shape("nvmlEventSetWait_v2", hang)
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES, read_timeout=0.2)
    try:
        yield sampler, hang
    finally:
        hang.release()
        wait_until(lambda: not sampler.busy(), 10, "the event wait to return")
        sampler.close()



def test_a_drain_finishing_after_the_deadline_is_counted_by_the_next_sample(late, caplog):
    sampler, hang = late
    first = sample_within(sampler, 5.0, THE_WAIT)
    assert hang.entered.is_set()
    # the wait hangs: no GPU waits on it, the node's call is named among the problems
    assert all(d.hung is None and d.values for d in first.devices), first.devices
    assert any("the node: nvmlEventSetWait has not returned" in e for e in first.errors)
    assert not any(first.devices[0].xid_counts.get(c) for c in (79, 48))
    lines = [r.getMessage() for r in caplog.records if "has not returned" in r.getMessage()]
    assert len(lines) == 1 and "nvmlEventSetWait" in lines[0], lines
    # while it still hangs, later samples go on and say it once more each, not the log
    assert any("nvmlEventSetWait" in e for e in sample_within(sampler, 5.0, THE_WAIT).errors)
    hang.release()
    wait_until(lambda: not sampler.busy(), 10, "the late drain to finish")
    after = sample_within(sampler, 5.0, THE_WAIT)
    assert after.devices[0].xid_counts[79] == 5 and after.devices[0].xid_counts[48] == 1
    assert [e.code for e in after.devices[0].xid_events].count(79) == 5
    assert not any("nvmlEventSetWait" in e for e in after.errors)
    # and once only: the late result is not counted again
    assert sample_within(sampler, 5.0, THE_WAIT).devices[0].xid_counts[79] == 5
    assert any("answered again" in r.getMessage() for r in caplog.records)
