"""What ``otel-gpu check`` says about one sample: plain data, and the text written from it.

The text and the JSON are both written from :func:`check_report`, so they cannot say
different things.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_gpu.snapshot import HolderTime, Snapshot
    from otel_gpu.workload import Workload


def _number(value: float) -> int | float | None:
    """A value as JSON writes it: whole numbers as integers, NaN and infinities as null."""
    if not math.isfinite(value):
        return None
    return int(value) if float(value).is_integer() else value


def _name(holder: Workload) -> str:
    """How the text names a holder: a pod's namespace/pod/container, a container's name
    (else its short id), a job's id."""
    from otel_gpu.workload import ContainerRef, PodRef

    if isinstance(holder, PodRef):
        return "/".join(p for p in (holder.namespace, holder.pod, holder.container) if p)
    if isinstance(holder, ContainerRef):
        return holder.name or holder.id[:12]
    return holder.job_id


def _share(value: float | None) -> int | float | None:
    return None if value is None else _number(round(value, 4))


def _time(row: HolderTime) -> dict[str, Any]:
    """One holder's GPU time in this sample: what share of the GPU it holds and keeps busy,
    and whether the allocation is idle (no process on it, or no activity)."""
    return {"workload": row.holder.sort_key[0], "name": _name(row.holder),
            "attributes": row.holder.attributes(), "share": _share(row.share),
            "active_share": _share(row.active_share), "idle": row.idle,
            "idle_seconds": None if row.idle_s is None else _number(round(row.idle_s, 3))}


def check_report(snapshot: Snapshot) -> dict[str, Any]:
    """What ``check`` says about one sample, as plain data: the text and the JSON are
    both written from it, so they cannot say different things."""
    from otel_gpu.instrument.catalog import CATALOG
    from otel_gpu.instrument.schema import device_observations

    devices = []
    ledger = snapshot.gpu_time
    times: dict[str, list[HolderTime]] = {}
    outside: dict[str, list[str]] = {}
    if ledger is not None:
        for row in ledger.holders:
            if row.share > 0:  # a holder still holding the device
                times.setdefault(row.uuid, []).append(row)
        outside = {d.uuid: list(d.outside_now) for d in ledger.devices}
    idle = []
    for sample in snapshot.devices:
        dev = sample.device
        holders = snapshot.pods.attribution.holders(dev.uuid) if snapshot.pods else ()
        values = []
        for metric in CATALOG:
            if metric.describes_device:  # the device's own fields say it
                continue
            for value, attrs in device_observations(metric, sample):
                if metric.name == "hw.status" and not value:
                    continue
                values.append({"metric": metric.name, "attributes": dict(attrs),
                               "value": _number(value), "unit": metric.unit})
        devices.append({
            "index": dev.index, "uuid": dev.uuid, "name": dev.name,
            "mig_profile": dev.mig_profile if dev.is_mig else None, "state": sample.state,
            "held_by": [{"namespace": h.namespace, "pod": h.pod, "container": h.container,
                         "replica": h.replica} for h in holders],
            "hpc_jobs": [job.job_id for job in snapshot.series_jobs(dev.uuid)],
            "gpu_time": [_time(row) for row in times.get(dev.uuid, ())],
            "outside_use": outside.get(dev.uuid, []),
            "error": sample.error, "hung": sample.hung, "values": values,
        })
        idle += [{"index": dev.index, "uuid": dev.uuid, **_time(row)}
                 for row in times.get(dev.uuid, ()) if row.idle]
    return {
        "driver": snapshot.driver_version, "sample_seconds": snapshot.duration,
        "notes": list(snapshot.notes), "problems": list(snapshot.errors),
        "idle_allocations": idle, "devices": devices,
    }


def print_report(report: dict[str, Any]) -> None:
    """``check``'s text: a summary line, the notes and problems, then each device."""
    print(f"driver {report['driver'] or 'unknown'}; {len(report['devices'])} device(s); "
          f"sample took {report['sample_seconds'] * 1000:.0f} ms")
    for note in report["notes"]:
        print(f"note: {note}")
    for problem in report["problems"]:
        print(f"problem: {problem}")
    for row in report["idle_allocations"]:
        print(f"idle allocation: {row['workload']} {row['name']} holds GPU {row['index']} "
              f"({row['uuid']}) with no process on it or no activity")
    for dev in report["devices"]:
        mig = f" MIG {dev['mig_profile']}" if dev["mig_profile"] is not None else ""
        print(f"\nGPU {dev['index']}{mig}  {dev['uuid']}  {dev['name']}  state={dev['state']}")
        for holder in dev["held_by"]:
            replica = f" (replica {holder['replica']})" if holder["replica"] is not None else ""
            print(f"  held by {holder['namespace']}/{holder['pod']}/{holder['container']}"
                  f"{replica}")
        for job in dev["hpc_jobs"]:
            print(f"  used by HPC job {job}")
        for row in dev["gpu_time"]:
            busy = row["active_share"]
            active = "an unknown part" if busy is None else f"{busy:.1%}"
            print(f"  time: {row['workload']} {row['name']} holds {row['share']:.1%} of the "
                  f"GPU, keeps {active} busy{', idle' if row['idle'] else ''}")
        for kind in dev["outside_use"]:
            print(f"  used outside any allocation: {kind}")
        if dev["error"]:
            print(f"  error: {dev['error']}")
        if dev["hung"]:
            print(f"  hung: {dev['hung']}")
        for row in dev["values"]:
            label = ",".join(f"{k}={v}" for k, v in row["attributes"].items())
            name = f"{row['metric']}{{{label}}}" if label else row["metric"]
            value = row["value"]
            shown = ("nan" if value is None else f"{value}" if isinstance(value, int)
                     else f"{value:.6g}")
            print(f"  {name:<58} {shown} {row['unit']}")
