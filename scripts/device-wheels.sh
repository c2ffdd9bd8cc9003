#!/usr/bin/env bash
# The wheels a GPU machine without network needs to run the real-GPU check
# (docs/device-check/README.md), downloaded into .whl/ where PyPI is reachable.
#
# The machine has Python 3.12 with torch, cupy, grpcio, prometheus-client, PyYAML and
# psutil; everything else the project needs (its
# dependencies, nvitop-exporter for the cost comparison, and what they require, walked
# from each wheel's Requires-Dist for CPython 3.12 on Linux x86_64) is downloaded here,
# one version of each (the version this checkout's virtual environment has, where it has
# the package), plus the project's own wheel.
#
#   scripts/device-wheels.sh            # PYTHON=... to use another interpreter
#   PRESENT="a b c" scripts/device-wheels.sh   # what the machine already has
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
# protobuf travels: the kubelet's generated code asks for the runtime it was generated with
# (7.35 or newer), newer than the one GPU images tend to carry; nvidia-ml-py too, so that the
# binding on the GPU is the one the tests ran (a few hundred KiB).
PRESENT=${PRESENT:-"grpcio prometheus-client pyyaml psutil torch cupy"}
EXTRA=${EXTRA:-"nvitop-exporter"}
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
PRESENT="$PRESENT" EXTRA="$EXTRA" "$PYTHON" - <<'EOF'
"""Download each requirement's wheel and walk its Requires-Dist, for CPython 3.12 x86_64."""
import importlib.metadata as md
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from pip._vendor.packaging.markers import Marker
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

OUT = Path(".whl")
ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "extra": ""}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
present = {canonicalize_name(n) for n in os.environ["PRESENT"].split()}
project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
todo = [Requirement(r) for r in project["dependencies"]]
todo += [Requirement(r) for r in os.environ["EXTRA"].split()]
seen: dict[str, str] = {}


def local_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


while todo:
    req = todo.pop(0)
    name = canonicalize_name(req.name)
    if req.marker is not None and not req.marker.evaluate(ENV):
        continue
    if name in present or name in seen:
        continue
    version = local_version(req.name)
    if version is not None and req.specifier and version not in req.specifier:
        version = None  # this checkout's is outside the range: the newest that fits
    spec = f"{req.name}=={version}" if version else f"{req.name}{req.specifier}"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp",
           *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(OUT), spec]
    subprocess.run(cmd, check=True, timeout=300)
    wheel = max((w for w in OUT.glob("*.whl")
                 if canonicalize_name(re.split(r"-\d", w.name, maxsplit=1)[0]) == name),
                key=lambda w: w.stat().st_mtime)
    seen[name] = wheel.name
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                dep = Requirement(line.split(":", 1)[1].strip())
                if dep.marker is None or dep.marker.evaluate(ENV):
                    todo.append(dep)
for name, wheel in sorted(seen.items()):
    print(f"{name:40} {wheel}")
print(f"{len(seen)} wheels; left to the machine: {', '.join(sorted(present))}")
EOF
"$PYTHON" -m pip wheel -q --no-deps -w .whl .
ls .whl/*.whl | wc -l
du -sh .whl
