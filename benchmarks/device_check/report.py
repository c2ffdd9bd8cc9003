"""The check's report: ``device-check.json`` and ``device-check.md``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.device_check.results import Result, Row


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return " ".join(text.split()).replace("|", "\\|")


def markdown(result: Result) -> str:
    env = result.environment
    gpus = env.get("gpus") or []
    names = sorted({g["name"] for g in gpus})
    lines = [
        "# otel-gpu device check",
        "",
        f"- **result**: {'PASS' if result.passed else 'FAIL'} "
        f"({len(result.rows) - len(result.failed)} of {len(result.rows)} comparisons passed"
        f"{', ' + str(len(result.errors)) + ' error(s)' if result.errors else ''})",
        f"- **GPU**: {len(gpus)} x {', '.join(names) or '?'}",
        f"- **driver**: {env.get('driver', '?')} (NVML {env.get('nvml', '?')}, "
        f"nvidia-ml-py {env.get('pynvml', '?')})",
        f"- **date**: {result.started}",
        f"- **mode**: {result.mode}; Python {env.get('python')}, host {env.get('host')}",
        f"- **command**: `{' '.join(result.command)}`",
        f"- **took**: {result.seconds:.0f} s",
        "",
    ]
    if result.errors:
        lines += ["## Errors", ""] + [f"- {e}" for e in result.errors] + [""]
    if result.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    phases = list(dict.fromkeys(r.phase for r in result.rows))
    lines += ["## Summary", "", "| phase | compared | passed | failed | series not compared |",
              "|---|---|---|---|---|"]
    for ph in phases:
        rows = [r for r in result.rows if r.phase == ph]
        bad = sum(1 for r in rows if not r.ok)
        nc = sum(result.not_compared.get(ph, {}).values())
        lines.append(f"| {ph} | {len(rows)} | {len(rows) - bad} | {bad} | {nc} |")
    lines.append("")
    if result.failed:
        lines += ["## Failed", "", "| phase | family | GPU | what | exported | reference | "
                  "rule | source | note |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [_row(r) for r in result.failed] + [""]
    lines += ["## Not compared", "",
              "Series exported that the check has no reference for, per phase and family.", ""]
    nc_any = False
    for ph, fams in result.not_compared.items():
        for fam, n in sorted(fams.items()):
            nc_any = True
            lines.append(f"- {ph}: `{fam}` ({n} series)")
    if not nc_any:
        lines.append("- none")
    lines.append("")
    if result.load:
        lines += ["## Load", "", "```json", json.dumps(result.load, indent=1, default=str), "```",
                  ""]
    if result.cost:
        lines += ["## Cost on this driver", "",
                  "| system | CPU per sample (ms) | CPU per gzip scrape (ms) | RSS (MiB) | "
                  "NVML calls per GPU per sample | gzip body (kB) |", "|---|---|---|---|---|---|"]
        for kind, c in result.cost.items():
            if "error" in c:
                lines.append(f"| {kind} | {_fmt(c['error'])} | | | | |")
                continue
            lines.append(f"| {kind} | {c['cpu_per_sample_ms']:.2f} | "
                         f"{c['cpu_per_gzip_scrape_ms']:.3f} | {c['rss_mib']:.1f} | "
                         f"{_fmt(c['nvml_calls_per_gpu_per_sample'])} | {c['gzip_kb']:.1f} |")
        lines.append("")
    functions = (result.latency or {}).get("functions") or {}
    if functions:
        lines += ["## NVML call latency", "",
                  f"{result.latency['calls']} calls each, on GPU 0; "
                  f"nvmlDeviceGetFieldValues with {result.latency['field_values_fields']} fields.",
                  "", "| function | p50 (us) | p90 (us) | error |", "|---|---|---|---|"]
        for name, t in sorted(functions.items(), key=lambda kv: -kv[1]["p50_us"]):
            lines.append(f"| {name} | {t['p50_us']:.1f} | {t['p90_us']:.1f} | "
                         f"{t['error'] or ''} |")
        if result.latency.get("not_timed"):
            lines.append("")
            lines.append("Called by the collector, not timed here: "
                         + ", ".join(result.latency["not_timed"]))
        lines.append("")
    lines += ["## Every comparison", "", "| phase | family | GPU | what | exported | reference | "
              "rule | source | note |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(r) for r in result.rows]
    return "\n".join(lines) + "\n"


def _row(r: Row) -> str:
    mark = "" if r.ok else "**FAIL** "
    return (f"| {r.phase} | {mark}`{r.family}` | {r.device} | {_fmt(r.what)} | "
            f"{_fmt(r.exported)} | {_fmt(r.reference)} | {r.rule} | {r.source} | {r.note} |")


def write(result: Result, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = asdict(result)
    data["passed"] = result.passed
    data["summary"] = {"compared": len(result.rows), "failed": len(result.failed),
                       "not_compared_series": {p: sum(f.values())
                                               for p, f in result.not_compared.items()}}
    js, md = out / "device-check.json", out / "device-check.md"
    js.write_text(json.dumps(data, indent=1, default=str))
    md.write_text(markdown(result))
    return js, md
