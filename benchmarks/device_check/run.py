"""One whole check: the phases in order, each one's failure reported, not fatal."""

from __future__ import annotations

import datetime as dt
import platform
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.device_check.collector import Collector, one, parse
from benchmarks.device_check.compare import Snapshot, compare_phase
from benchmarks.device_check.cost import run_cost
from benchmarks.device_check.load import Load, load_available, load_rows, new_pid
from benchmarks.device_check.pods import run_pods, write_tree
from benchmarks.device_check.reader import Reader
from benchmarks.device_check.results import Options, Result
from benchmarks.device_check.smi import compare_smi


def run(opts: Options, argv: list[str]) -> Result:
    result = Result(started=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    mode=f"simulated ({opts.simulate})" if opts.simulate else "real driver",
                    command=["python", "-m", "benchmarks.device_check", *argv])
    began = time.monotonic()
    result.environment = {"python": platform.python_version(), "host": platform.node(),
                          "kernel": platform.release()}
    reader = Reader(opts.reference or opts.simulate)
    kubelet = collector = None
    loads: list[Load] = []
    tmp = Path(tempfile.mkdtemp(prefix="otel-gpu-check-", dir="/tmp"))
    try:
        hello = reader.ask("hello")
        driver = hello["driver"]
        result.environment.update(driver=driver, nvml=hello["nvml"], pynvml=hello["pynvml"],
                                  gpus=hello["gpus"])
        uuids = {g["uuid"]: g["index"] for g in hello["gpus"]}
        from testkit.kubelet import FakeKubelet

        kubelet = FakeKubelet().start()
        node = tmp / "node"
        write_tree(node, [])
        args = ["serve", "--listen", "127.0.0.1:0", "--interval", f"{opts.interval:g}",
                "--kubelet-socket", kubelet.socket_path, "--kubelet-interval", "0.5",
                "--process-usage", "true", "--proc-root", str(node / "proc"),
                "--pod-log-root", str(node / "var" / "log" / "pods")]
        if opts.simulate:
            args = ["--simulate", opts.simulate, *args]
        collector = Collector(args)
        collector.first_sample()
        sim = bool(opts.simulate)
        window = 0.05 if sim else 1.0

        def phase(name: str, **kw: Any) -> Snapshot:
            return compare_phase(result, name, collector, reader, sim, opts.interval, driver,
                                 window, **kw)

        idle = phase("idle")
        compare_smi(result, "idle", collector, uuids)
        target = next(iter(uuids))
        pids: list[int] = []
        engine = None if sim or "load" in opts.skip else load_available()
        if engine is None and not sim:
            result.note("load: neither torch nor cupy imports (or --skip load): "
                        "the load phase is skipped")
        if engine is not None:
            listed = reader.ask("procs").get(target)
            known = {pid for pid, _ in listed} if isinstance(listed, list) else set()
            loads.append(Load(opts.load_seconds, opts.load_gib))
            result.load["engine"] = loads[0].wait_ready()
            pids.append(new_pid(reader, target, known))
            _, busy, _ = collector.fresh(
                after=idle.count, deadline_s=60.0,
                until=lambda body: (one(parse(body), "hw_gpu_utilization", hw_id=target,
                                         hw_gpu_task="general") or 0) > 0.5)
            # The GPM window of the first sample to show the load began before the load did
            # (0.39 SM activity on an H200 where the load held 0.96): the next one lies in it.
            loaded = phase("load", after=busy, flags_move=True)
            load_rows(result, idle, loaded, target)
            compare_smi(result, "load", collector, uuids)
        elif sim:
            procs = reader.ask("procs", sample=int(idle.count))
            target = next((u for u, p in procs.items() if isinstance(p, list) and len(p) >= 2),
                          target)
            pids = [pid for pid, _ in procs.get(target, [])][:2]
            result.note("load: simulated driver: no load phase; the pods phase places the "
                        f"scenario's processes {pids} on GPU {uuids[target]}")
        if "pods" in opts.skip:
            result.note("pods: skipped (--skip pods)")
        elif not pids:
            result.note("pods: no GPU process to place in a pod: the pods phase is skipped")
        else:
            run_pods(result, opts, collector, reader, kubelet, node, target, pids, loads, phase)
        for load in loads:
            result.load.setdefault("finished", []).append(load.stop())
        loads.clear()
        collector.stop()
        collector = None
        if "cost" in opts.skip:
            result.note("cost: skipped (--skip cost)")
        else:
            run_cost(result, opts, len(uuids), tmp)
        if "latency" in opts.skip:
            result.note("latency: skipped (--skip latency)")
        else:
            symbols = sorted((result.cost.get("otel-gpu") or {}).get("nvml_calls_by_symbol", {}))
            result.latency = reader.ask("latency", timeout=120, calls=opts.latency_calls,
                                        symbols=symbols)
    except Exception as exc:  # noqa: BLE001 - a phase's failure is the check's finding
        result.errors.append(f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    finally:
        for load in loads:
            load.stop()
        if collector is not None:
            collector.stop()
        if kubelet is not None:
            kubelet.close()
        reader.close()
        shutil.rmtree(tmp, ignore_errors=True)
    result.seconds = time.monotonic() - began
    return result
