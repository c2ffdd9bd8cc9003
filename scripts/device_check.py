#!/usr/bin/env python3
"""The real-GPU check, from a checkout: ``python scripts/device_check.py --out DIR``.

The check lives in :mod:`benchmarks.device_check` (it reuses the benchmark's launcher,
baselines and testkit's fake kubelet); this wrapper runs it from the repository root
so that the old path keeps working. See docs/device-check/README.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    from benchmarks.device_check.cli import main

    raise SystemExit(main())
