"""Comparing one scrape with the reference read right after it: the catalog's series
(:func:`compare_specs`), the families no single reading gives (:func:`compare_custom`), and
the per-pod usage rows against NVML's processes (:func:`usage_rows`)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from benchmarks.device_check.collector import Collector, Samples, index_of, one, parse
from benchmarks.device_check.reader import Reader
from benchmarks.device_check.reference import COLLECTORS_READER, refused
from benchmarks.device_check.results import Result, Row
from benchmarks.device_check.specs import (
    EXACT,
    FLAGS_UNDER_LOAD,
    GAP_SLACK,
    SPECS,
    THROTTLE_FAMILY,
    Spec,
    Tol,
)

SHARE_SUM = Tol("gauge", abs=0.3, text="sum ±0.3 (another window)")



@dataclass
class Snapshot:
    """One scrape and the reference read right after it."""

    body: str
    samples: Samples
    reference: dict[str, dict[str, Any]]
    gap: float
    count: float


def take(collector: Collector, reader: Reader, simulate: bool, after: float | None,
         gpm_window: float, until: Callable[[str], bool] | None = None) -> Snapshot:
    body, count, scraped = collector.fresh(after, until=until)
    samples = parse(body)
    ref = reader.ask("read", sample=int(count) if simulate else None, gpm_window=gpm_window)
    age = (one(samples, "otel_gpu_sample_age_seconds") or 0.0) + (
        one(samples, "otel_gpu_sample_duration_seconds") or 0.0)
    gap = age + (time.monotonic() - scraped) + GAP_SLACK
    return Snapshot(body, samples, ref["gpus"], gap, count)


def value_text(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 6)
    return value


def compare_specs(phase: str, snap: Snapshot, specs: Iterable[Spec] = SPECS,
                  flags_move: bool = False) -> tuple[list[Row], set[tuple[str, tuple]]]:
    """Every spec on every GPU; returns the rows and the (family, labels) series used."""
    rows, used = [], set()
    index = index_of(snap.samples)
    for uuid, ref in snap.reference.items():
        gpu = str(ref.get("index", "?"))
        theirs = set(ref.get("_collectors_reader", ()))
        for spec in specs:
            want = dict(spec.labels, hw_id=uuid)
            found = [(lab, v) for lab, v in index.get(spec.family, [])
                     if all(lab.get(k) == x for k, x in want.items())]
            for lab, _ in found:
                used.add((spec.family, tuple(sorted(lab.items()))))
            what = ",".join(v for _, v in spec.labels) or "-"
            source = COLLECTORS_READER if spec.key in theirs else "pynvml"
            value = spec.expected(ref)
            tol = spec.tol
            if flags_move and spec.family == THROTTLE_FAMILY:
                tol = FLAGS_UNDER_LOAD
            if refused(value):
                assert isinstance(value, str)
                rows.append(Row(phase, spec.family, gpu, what, [v for _, v in found] or None,
                                value[4:], "absent: NVML refuses it", not found, source=source))
                continue
            assert isinstance(value, int | float), value
            reference = float(value)
            if len(found) != 1:
                rows.append(Row(phase, spec.family, gpu, what,
                                None if not found else [v for _, v in found],
                                value_text(reference), tol.describe(), False, source=source,
                                note="missing" if not found else "several series"))
                continue
            exported = found[0][1]
            rows.append(Row(phase, spec.family, gpu, what, value_text(exported),
                            value_text(reference), tol.describe(),
                            tol.ok(exported, reference, snap.gap), source=source))
    return rows, used


def compare_custom(phase: str, snap: Snapshot, driver: str, interval: float,
                   collector_age: float) -> tuple[list[Row], set[tuple[str, tuple]]]:
    """The families no single reading gives: state, identity, the collector's own."""
    rows, used = [], set()
    index = index_of(snap.samples)

    def mark(family: str, lab: dict[str, str]) -> None:
        used.add((family, tuple(sorted(lab.items()))))

    for uuid, ref in snap.reference.items():
        gpu = str(ref.get("index", "?"))
        states = {lab.get("hw_state"): v for lab, v in index.get("hw_status", [])
                  if lab.get("hw_id") == uuid}
        for lab, _ in index.get("hw_status", []):
            if lab.get("hw_id") == uuid:
                mark("hw_status", lab)
        on = sorted(s for s, v in states.items() if v == 1)
        rows.append(Row(phase, "hw_status", gpu, "state", on, ref["state"],
                        "the one state at 1", on == [ref["state"]]))
        infos = [lab for lab, _ in index.get("nvidia_gpu_info", []) if lab.get("hw_id") == uuid]
        for lab in infos:
            mark("nvidia_gpu_info", lab)
        info = infos[0] if len(infos) == 1 else {}
        expect = {"hw_model": ref.get("name"), "hw_name": ref.get("name"),
                  "hw_serial_number": ref.get("serial"),
                  "nvidia_gpu_pci_bus_id": ref.get("pci_bus_id"),
                  "nvidia_gpu_index": str(ref.get("index")), "hw_driver_version": driver,
                  "nvidia_gpu_numa_node": (None if refused(ref.get("numa"))
                                           else str(ref.get("numa")))}
        for label, want in expect.items():
            if want is None or refused(want):
                rows.append(Row(phase, "nvidia_gpu_info", gpu, label, info.get(label),
                                "refused by NVML", "not compared: NVML gives none", True,
                                note="sysfs or the kubelet may give it"))
                continue
            got = info.get(label)
            rows.append(Row(phase, "nvidia_gpu_info", gpu, label, got, want, "exact",
                            got == want))
    gpus = len(snap.reference)
    devices = {lab.get("hw_state"): v for lab, v in index.get("otel_gpu_devices", [])}
    for lab, _ in index.get("otel_gpu_devices", []):
        mark("otel_gpu_devices", lab)
    rows.append(Row(phase, "otel_gpu_devices", "-", "ok", devices.get("ok"), gpus,
                    "exact (no MIG)", devices.get("ok") == gpus, source="NVML count"))
    for lab, value in index.get("otel_gpu_device_sample_age_seconds", []):
        mark("otel_gpu_device_sample_age_seconds", lab)
        rows.append(Row(phase, "otel_gpu_device_sample_age_seconds",
                        lab.get("nvidia_gpu_index", "-"), "-", value_text(value),
                        2 * interval, "at most", 0 <= value <= 2 * interval, source="interval"))
    for family, limit in (("otel_gpu_sample_age_seconds", 2 * interval),
                          ("otel_gpu_sample_duration_seconds", interval)):
        value = one(snap.samples, family)
        used.add((family, ()))
        rows.append(Row(phase, family, "-", "-", value_text(value), limit, "at most",
                        value is not None and 0 <= value <= limit, source="interval"))
    count = one(snap.samples, "otel_gpu_samples_total")
    used.add(("otel_gpu_samples_total", ()))
    most = collector_age / interval + 2
    rows.append(Row(phase, "otel_gpu_samples_total", "-", "-", count, round(most, 1),
                    "1 .. age / interval + 2", count is not None and 1 <= count <= most,
                    source="interval"))
    rows += _energy_rows(phase, snap, index, used)
    return rows, used


def _energy_rows(phase: str, snap: Snapshot, index: dict, used: set) -> list[Row]:
    """Per GPU, the per-pod energy rows (the unattributed one included) sum to hw_energy."""
    rows = []
    for uuid, ref in snap.reference.items():
        parts = [(lab, v) for lab, v in index.get("nvidia_gpu_k8s_energy_joules_total", [])
                 if lab.get("hw_id") == uuid]
        if not parts:
            continue
        for lab, _ in parts:
            used.add(("nvidia_gpu_k8s_energy_joules_total", tuple(sorted(lab.items()))))
        total = [v for lab, v in index.get("hw_energy_joules_total", [])
                 if lab.get("hw_id") == uuid]
        got = sum(v for _, v in parts)
        want = total[0] if len(total) == 1 else None
        rows.append(Row(phase, "nvidia_gpu_k8s_energy_joules_total", str(ref.get("index")),
                        "sum of rows", round(got, 6), want, "= hw_energy (±1 mJ)",
                        want is not None and abs(got - want) <= 0.0015, source="consistency"))
    return rows


USAGE_SHARES = ("nvidia_gpu_k8s_sm_utilization", "nvidia_gpu_k8s_memory_controller_utilization",
                "nvidia_gpu_k8s_encoder_utilization", "nvidia_gpu_k8s_decoder_utilization")


def usage_rows(phase: str, snap: Snapshot, reader: Reader, simulate: bool, interval: float,
               held: str | None) -> tuple[list[Row], set[tuple[str, tuple]]]:
    """Per GPU, the per-pod usage rows (the unattributed one included) against NVML's
    processes: memory and process counts exact, the utilisation shares' sums within 0.3,
    and the energy rule of a GPU no pod holds."""
    rows, used = [], set()
    index = index_of(snap.samples)
    at = int(snap.count) if simulate else None
    procs = reader.ask("procs", sample=at)
    for uuid, ref in snap.reference.items():
        gpu = str(ref.get("index"))
        listed = procs.get(uuid)
        if not isinstance(listed, list):
            continue
        shares = reader.ask("proc_util", sample=at, index=ref["index"],
                            seconds=max(2 * interval, 1.0))
        if "error_code" in shares:
            shares = {} if "Not Found" in shares["error_code"] else None
        for family, want, tol in (
                ("nvidia_gpu_k8s_memory_usage_bytes", sum(m or 0 for _, m in listed), EXACT),
                ("nvidia_gpu_k8s_processes", len(listed), EXACT),
                *((f, None if shares is None else sum(v[i] for v in shares.values()),
                   SHARE_SUM)
                  for i, f in enumerate(USAGE_SHARES))):
            found = [(lab, v) for lab, v in index.get(family, []) if lab.get("hw_id") == uuid]
            for lab, _ in found:
                used.add((family, tuple(sorted(lab.items()))))
            if want is None:
                rows.append(Row(phase, family, gpu, "sum of rows", len(found) or None,
                                "refused by NVML", "absent", not found))
                continue
            if not found and want == 0:
                continue  # no process, no row
            got = sum(v for _, v in found)
            rows.append(Row(phase, family, gpu, "sum of rows", value_text(got),
                            value_text(float(want)), tol.describe(),
                            tol.ok(got, float(want), snap.gap)))
        if uuid != held:  # processes of no pod: split by their shares when NVML gives them
            want_rule = "sm_share" if listed and shares is not None else "unattributed"
            rules = [lab.get("nvidia_gpu_energy_rule") for lab, v in
                     index.get("nvidia_gpu_k8s_energy_rule", []) if lab.get("hw_id") == uuid]
            for lab, _ in index.get("nvidia_gpu_k8s_energy_rule", []):
                if lab.get("hw_id") == uuid:
                    used.add(("nvidia_gpu_k8s_energy_rule", tuple(sorted(lab.items()))))
            rows.append(Row(phase, "nvidia_gpu_k8s_energy_rule", gpu, "rule", rules,
                            [want_rule], "no pod holds it", rules == [want_rule],
                            source="kubelet"))
    for family in ("otel_gpu_reader_failures_total",):
        for lab, value in index.get(family, []):
            used.add((family, tuple(sorted(lab.items()))))
            if value:
                rows.append(Row(phase, family, "-", lab.get("otel_gpu_reader", str(lab)), value,
                                0, "no reader failed", False, source="collector"))
    if held is None:
        for family, want in (("otel_gpu_kubelet_pods", 0), ("otel_gpu_kubelet_devices", 0),
                             ("otel_gpu_kubelet_unresolved_ids", 0)):
            got = one(snap.samples, family)
            used.add((family, ()))
            rows.append(Row(phase, family, "-", "-", got, want, "exact", got == want,
                            source="kubelet"))
    age = one(snap.samples, "otel_gpu_kubelet_mapping_age_seconds")
    if age is not None:
        used.add(("otel_gpu_kubelet_mapping_age_seconds", ()))
        rows.append(Row(phase, "otel_gpu_kubelet_mapping_age_seconds", "-", "-",
                        value_text(age), 5.0, "at most (polled every 0.5 s)", 0 <= age <= 5,
                        source="kubelet"))
    return rows, used


def not_compared(samples: Samples,
                 used: set[tuple[str, tuple]]) -> dict[str, int]:
    """Series of each family the phase exported and compared with nothing."""
    out: dict[str, int] = {}
    for name, lab, _ in samples:
        if (name, tuple(sorted(lab.items()))) not in used:
            out[name] = out.get(name, 0) + 1
    return out


def compare_phase(result: Result, phase: str, collector: Collector, reader: Reader,
                  simulate: bool, interval: float, driver: str, gpm_window: float,
                  after: float | None = None, flags_move: bool = False,
                  extra: Callable[[Snapshot], tuple[list[Row], set]] | None = None,
                  until: Callable[[str], bool] | None = None,
                  held: str | None = None) -> Snapshot:
    """Compare a fresh sample; moving values that failed get one more try on the next."""
    snap = take(collector, reader, simulate, after, gpm_window, until)
    rows, used = compare_specs(phase, snap, flags_move=flags_move)
    custom, used2 = compare_custom(phase, snap, driver, interval,
                                   time.monotonic() - collector.started)
    rows += custom
    used |= used2
    more, used3 = usage_rows(phase, snap, reader, simulate, interval, held)
    rows += more
    used |= used3
    if extra is not None:
        more, used3 = extra(snap)
        rows += more
        used |= used3
    moving = {s.family for s in SPECS if s.tol.moving}
    retry = [r for r in rows if not r.ok and r.family in moving
             and r.source in ("pynvml", COLLECTORS_READER)]
    if retry:
        again = take(collector, reader, simulate, snap.count, gpm_window, until)
        second, _ = compare_specs(phase, again, flags_move=flags_move)
        by_key = {(r.family, r.device, r.what): r for r in second}
        for i, row in enumerate(rows):
            if row in retry:
                new = by_key.get((row.family, row.device, row.what))
                if new is not None:
                    new.note = f"second try (first: exported {row.exported}, " \
                               f"reference {row.reference})"
                    rows[i] = new
    result.add(*rows)
    result.not_compared[phase] = not_compared(snap.samples, used)
    failed = [r for r in rows if not r.ok]
    print(f"device-check: {phase}: {len(rows) - len(failed)} of {len(rows)} comparisons "
          f"passed, {sum(result.not_compared[phase].values())} series not compared",
          file=sys.stderr)
    return snap
