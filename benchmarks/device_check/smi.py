"""nvidia-smi ``-q -x`` where it reports a value otel-gpu exports: a second reference,
read right after a scrape as the pynvml one is."""

from __future__ import annotations

import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from typing import Any

from benchmarks.device_check.collector import Collector, index_of, parse
from benchmarks.device_check.results import Result, Row
from benchmarks.device_check.specs import CLOCK, EXACT, MEMORY, MIB, POWER, PSTATE, TEMP, UTIL, Tol

SMI = [  # (xpath under <gpu>, family, labels, scale to the exported unit, tolerance)
    ("fb_memory_usage/total", "hw_gpu_memory_limit_bytes", {}, MIB, Tol("gauge", abs=MIB)),
    ("fb_memory_usage/used", "hw_gpu_memory_usage_bytes", {}, MIB,
     Tol("gauge", abs=MEMORY.abs + MIB)),
    ("fb_memory_usage/reserved", "nvidia_gpu_memory_reserved_bytes", {}, MIB,
     Tol("gauge", abs=MIB)),
    ("temperature/gpu_temp", "hw_temperature_celsius", {"hw_sensor_location": "gpu"}, 1, TEMP),
    ("temperature/memory_temp", "hw_temperature_celsius", {"hw_sensor_location": "memory"}, 1,
     TEMP),
    ("gpu_power_readings/average_power_draw", "hw_power_watts", {}, 1, POWER),
    ("gpu_power_readings/power_draw", "hw_power_watts", {}, 1, POWER),
    ("gpu_power_readings/requested_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "current"}, 1, Tol("gauge", abs=0.01)),
    ("gpu_power_readings/current_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "enforced"}, 1, Tol("gauge", abs=0.01)),
    ("gpu_power_readings/default_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "default"}, 1, Tol("gauge", abs=0.01)),
    ("gpu_power_readings/min_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "min"}, 1, Tol("gauge", abs=0.01)),
    ("gpu_power_readings/max_power_limit", "nvidia_gpu_power_limit_watts",
     {"nvidia_gpu_power_limit_type": "max"}, 1, Tol("gauge", abs=0.01)),
    ("utilization/gpu_util", "hw_gpu_utilization", {"hw_gpu_task": "general"}, 0.01, UTIL),
    ("utilization/memory_util", "nvidia_gpu_memory_controller_utilization", {}, 0.01, UTIL),
    ("utilization/encoder_util", "hw_gpu_utilization", {"hw_gpu_task": "encoder"}, 0.01, UTIL),
    ("utilization/decoder_util", "hw_gpu_utilization", {"hw_gpu_task": "decoder"}, 0.01, UTIL),
    ("max_clocks/graphics_clock", "nvidia_gpu_clock_max_frequency_hertz",
     {"nvidia_gpu_clock_domain": "graphics"}, 1e6, EXACT),
    ("max_clocks/sm_clock", "nvidia_gpu_clock_max_frequency_hertz",
     {"nvidia_gpu_clock_domain": "sm"}, 1e6, EXACT),
    ("max_clocks/mem_clock", "nvidia_gpu_clock_max_frequency_hertz",
     {"nvidia_gpu_clock_domain": "memory"}, 1e6, EXACT),
    ("max_clocks/video_clock", "nvidia_gpu_clock_max_frequency_hertz",
     {"nvidia_gpu_clock_domain": "video"}, 1e6, EXACT),
    ("clocks/sm_clock", "nvidia_gpu_clock_frequency_hertz", {"nvidia_gpu_clock_domain": "sm"},
     1e6, CLOCK),
    ("clocks/mem_clock", "nvidia_gpu_clock_frequency_hertz",
     {"nvidia_gpu_clock_domain": "memory"}, 1e6, CLOCK),
    ("pci/pci_gpu_link_info/link_widths/max_link_width", "nvidia_gpu_pcie_link_max_width", {},
     1, EXACT),
    ("performance_state", "nvidia_gpu_performance_state", {}, 1, PSTATE),
]


def smi_values(xml_text: str) -> dict[str, dict[str, Any]]:
    """Per GPU UUID, the text nvidia-smi gives at each path of :data:`SMI`, and more."""
    root = ET.fromstring(xml_text)
    out = {"_driver": {"driver": (root.findtext("driver_version") or "").strip()}}
    for gpu in root.findall("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        values = {path: (gpu.findtext(path) or "").strip() for path, *_ in SMI}
        values["product_name"] = (gpu.findtext("product_name") or "").strip()
        values["serial"] = (gpu.findtext("serial") or "").strip()
        values["pci_bus_id"] = (gpu.findtext("pci/pci_bus_id") or "").strip()
        values["processes"] = [((p.findtext("pid") or "").strip(),
                                (p.findtext("used_memory") or "").strip())
                               for p in gpu.findall("processes/process_info")]
        out[uuid] = values
    return out


def _smi_number(text: str) -> float | None:
    if not text or "N/A" in text or "Not Supported" in text or "Unknown" in text:
        return None
    token = text.split()[0].lstrip("P").rstrip("x")
    try:
        return float(token)
    except ValueError:
        return None


def compare_smi(result: Result, phase: str, collector: Collector, gpus: dict[str, int]) -> None:
    """nvidia-smi -q -x where it reports the value otel-gpu exports (read right after a
    scrape, as the pynvml reference is)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        result.note(f"{phase}: nvidia-smi not found: its cross-check is skipped")
        return
    status, body = collector.scrape()
    started = time.monotonic()
    try:
        xml_text = subprocess.run([smi, "-q", "-x"], capture_output=True, text=True,
                                  timeout=60, check=True).stdout
        values = smi_values(xml_text)
    except (subprocess.SubprocessError, OSError, ET.ParseError) as exc:
        result.errors.append(f"{phase}: nvidia-smi -q -x failed: {exc}")
        return
    gap = time.monotonic() - started + 2.0
    index = index_of(parse(body)) if status == 200 else {}
    rows = []
    for uuid, gpu in gpus.items():
        got = values.get(uuid)
        if got is None:
            rows.append(Row(phase, "nvidia-smi", str(gpu), "uuid", uuid, None, "listed", False,
                            source="nvidia-smi"))
            continue
        for path, family, labels, scale, tol in SMI:
            number = _smi_number(got[path])
            found = [v for lab, v in index.get(family, []) if lab.get("hw_id") == uuid
                     and all(lab.get(k) == x for k, x in labels.items())]
            if number is None:
                continue  # nvidia-smi does not report it here: nothing to cross-check
            want = number * scale
            ok = len(found) == 1 and tol.ok(found[0], want, gap)
            rows.append(Row(phase, family, str(gpu), f"{path}", found[0] if found else None,
                            want, tol.describe(), ok, source="nvidia-smi"))
        infos = [lab for lab, _ in index.get("nvidia_gpu_info", []) if lab.get("hw_id") == uuid]
        info = infos[0] if infos else {}
        for label, key in (("hw_model", "product_name"), ("hw_serial_number", "serial")):
            if got[key] and "N/A" not in got[key]:
                rows.append(Row(phase, "nvidia_gpu_info", str(gpu), label, info.get(label),
                                got[key], "exact", info.get(label) == got[key],
                                source="nvidia-smi"))
        if got["pci_bus_id"]:
            mine = (info.get("nvidia_gpu_pci_bus_id") or "").upper()
            rows.append(Row(phase, "nvidia_gpu_info", str(gpu), "nvidia_gpu_pci_bus_id", mine,
                            got["pci_bus_id"].upper(), "exact (case aside)",
                            mine == got["pci_bus_id"].upper(), source="nvidia-smi"))
    driver = values["_driver"]["driver"]
    versions = {lab.get("hw_driver_version") for lab, _ in index.get("nvidia_gpu_info", [])}
    rows.append(Row(phase, "nvidia_gpu_info", "-", "hw_driver_version", sorted(versions),
                    driver, "exact", versions == {driver}, source="nvidia-smi"))
    result.add(*rows)
