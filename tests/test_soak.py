"""The soak script's short run with pod churn, as a smoke test: it ends clean and the
collector follows the churn. Memory growth is the script's to report, not asserted here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_a_short_soak_with_pod_churn_ends_clean_and_sees_the_last_pods():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--duration", "6", "--clients", "1",
         "--churn", "24", "--churn-every", "0.5"],
        capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    churn = re.search(r"(\d+) generations; (\d+) allocation series at the end", done.stdout)
    assert churn and int(churn.group(1)) >= 5, done.stdout
    assert int(churn.group(2)) == 24, done.stdout  # the latest generation, and only it
    assert re.search(r"scrapes: [1-9]\d* ok, 0 errors", done.stdout), done.stdout
    assert "after the warm-up" in done.stdout
