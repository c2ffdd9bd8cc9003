"""Large buffers go back to the system once freed (the start-up's malloc setting)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from otel_gpu._memory import return_freed_memory

PROBE = """
import sys
from otel_gpu._memory import return_freed_memory

def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

if sys.argv[1] == "set":
    assert return_freed_memory()
body = bytearray(24 << 20)  # a large body, written and dropped: glibc raises its threshold
body[::4096] = b"x" * len(body[::4096])
del body
before = rss_kib()
chunks = []
for _ in range(24):  # then a publication's buffers of a megabyte each
    chunk = bytearray(1 << 20)
    chunk[::4096] = b"x" * len(chunk[::4096])
    chunks.append(chunk)
chunks.reverse()
del chunk
while chunks:
    chunks.pop()
    if len(chunks) == 12:
        # a small object that lives on, above the freed buffers in the heap
        keep = bytearray(64)
print(rss_kib() - before)
"""


def _kept_kib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         timeout=60, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_buffers_freed_after_a_large_one_are_returned():
    assert return_freed_memory()
    kept = _kept_kib("set")
    assert kept < 4 << 10, f"{kept} KiB still resident after the buffers were freed"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_without_the_setting_they_stay_resident():
    """The probe can tell: glibc's own adaptive threshold keeps them."""
    assert _kept_kib("plain") > 8 << 10
