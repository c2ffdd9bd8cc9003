"""A stage on a thread of its own: a call that does not return costs its attributes only."""

from __future__ import annotations

import logging
import threading

import pytest

from otel_gpu.attribute.enrich import Bounded
from otel_gpu.snapshot import Snapshot
from testkit.process import wait_until
from tests.support.snapshots import snapshot
from tests.support.stages import GatedStage


def test_a_held_call_costs_the_attributes_then_the_stage_comes_back(caplog):
    gate = GatedStage()
    stage = Bounded(gate, "pod", deadline=0.05)
    try:
        with caplog.at_level(logging.INFO, logger="otel_gpu"):
            first = snapshot(seq=1)
            assert stage.process(first) is first  # given up on at the deadline
            for seq in range(2, 6):  # held: handed on at once, never queued
                later = snapshot(seq=seq)
                assert stage.process(later) is later
            assert gate.calls == 1
            gate.open.set()
            wait_until(lambda: gate.running == 0, 5, "the held call to return")
            assert stage.process(snapshot(seq=6)).seq == 1006
        assert gate.most == 1  # one call at a time, as under the pipeline's lock
        lines = [(r.levelname, r.getMessage()) for r in caplog.records]
        held = [m for level, m in lines if level == "WARNING"]
        assert len(held) == 1 and held[0].startswith("pod attribution took longer than 0.05 s")
        assert any(m.startswith("pod attribution is back") for level, m in lines
                   if level == "INFO"), lines
    finally:
        gate.open.set()
        stage.close()


def test_a_quick_stage_is_applied_and_its_errors_reach_the_caller():
    gate = GatedStage()
    gate.open.set()
    stage = Bounded(gate, "pod", deadline=5.0)
    try:
        assert stage.process(snapshot(seq=3)).seq == 1003

        class Broken:
            def process(self, snap: Snapshot) -> Snapshot:
                raise ValueError("a bug in the stage")

        broken = Bounded(Broken(), "HPC job", deadline=5.0)
        with pytest.raises(ValueError, match="a bug in the stage"):
            broken.process(snapshot(seq=1))
        broken.close()
    finally:
        stage.close()


def test_close_ends_the_thread():
    gate = GatedStage()
    gate.open.set()
    stage = Bounded(gate, "container", deadline=5.0)
    stage.process(snapshot(seq=1))
    thread = next(t for t in threading.enumerate() if t.name == "otel-gpu-attribute-container")
    stage.close()
    thread.join(5)
    assert not thread.is_alive()
