#!/usr/bin/env python3
"""Compare otel-gpu with nvidia-smi on a machine with a real NVIDIA GPU.

Starts the real collector against the real driver, reads /metrics once, and
compares per GPU what nvidia-smi reports: memory used and total, temperature,
power, SM clock and utilization. Prints one line per check and exits 1 if any
differs beyond what the time between the two reads explains.

    python scripts/device_check.py [--tolerance-power 25]
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUERY = "uuid,memory.used,memory.total,temperature.gpu,power.draw,clocks.sm,utilization.gpu"


def smi() -> dict[str, dict[str, float]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout
    rows = {}
    for row in csv.reader(io.StringIO(out)):
        uuid, used, total, temp, power, sm, util = (c.strip() for c in row)
        as_float = lambda v: float(v) if v not in ("[N/A]", "N/A", "") else None  # noqa: E731
        rows[uuid] = {"used_mib": as_float(used), "total_mib": as_float(total),
                      "temp": as_float(temp), "power_w": as_float(power),
                      "sm_mhz": as_float(sm), "util": as_float(util)}
    return rows


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def value(text: str, name: str, uuid: str, extra: str = "") -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'hw_id="{uuid}"' in line and extra in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tolerance-power", type=float, default=25.0, help="watts")
    args = parser.parse_args()
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_gpu", "--listen", "127.0.0.1:0", "--interval", "1",
         "--pod-attribution", "false"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    log: list[str] = []
    try:
        assert proc.stdout is not None
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            log.append(line)
            match = re.search(r"serving metrics on https?://[^:]+:(\d+)/", line)
            port = int(match.group(1)) if match else None
        if port is None:
            print("otel-gpu did not start:\n" + "".join(log), file=sys.stderr)
            return 1
        text = ""
        while "otel_gpu_samples_total" not in text and time.monotonic() < deadline:
            text = scrape(port)
            time.sleep(0.2)
        reference = smi()
        text = scrape(port)
        failures = 0
        for uuid, want in reference.items():
            checks = [
                ("memory used MiB", value(text, "hw_gpu_memory_usage_bytes", uuid),
                 want["used_mib"], 2**20, 64),
                ("memory total MiB", value(text, "hw_gpu_memory_limit_bytes", uuid),
                 want["total_mib"], 2**20, 1),
                ("temperature C", value(text, "hw_temperature_celsius", uuid,
                                        'hw_sensor_location="gpu"'), want["temp"], 1, 3),
                ("power W", value(text, "hw_power_watts", uuid), want["power_w"], 1,
                 args.tolerance_power),
                ("SM clock MHz", value(text, "nvidia_gpu_clock_frequency_hertz", uuid,
                                       'nvidia_gpu_clock_domain="sm"'), want["sm_mhz"], 1e6, 300),
                ("utilization %", value(text, "hw_gpu_utilization", uuid,
                                        'hw_gpu_task="general"'), want["util"], 0.01, 20),
            ]
            for what, ours, theirs, divisor, tolerance in checks:
                if theirs is None:
                    print(f"{uuid} {what}: nvidia-smi has no value; otel-gpu: {ours}")
                    continue
                if ours is None:
                    print(f"FAIL {uuid} {what}: missing from /metrics (nvidia-smi {theirs})")
                    failures += 1
                    continue
                ours_scaled = ours / divisor
                ok = abs(ours_scaled - theirs) <= tolerance
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {uuid} {what}: otel-gpu {ours_scaled:.1f} "
                      f"nvidia-smi {theirs:.1f}")
        print(f"{len(reference)} GPU(s), {failures} failure(s)")
        return 1 if failures or not reference else 0
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    raise SystemExit(main())
