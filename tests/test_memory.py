"""The memory a running collector holds: freed buffers returned, tables loaded only when asked."""

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


def test_a_start_without_other_exporters_options_leaves_their_tables_unloaded():
    """The other exporters' flag and variable tables and check's report are loaded only
    when a foreign option or ``check`` asks for them."""
    probe = ("import sys\n"
             "from otel_gpu import cli\n"
             "from otel_gpu.config import load\n"
             "load({'interval': '5s'}, environ={'HOME': '/', 'NO_DCGM_EXPORTER_X': 'x'})\n"
             "print(sorted(m for m in ('otel_gpu.config.foreign', 'otel_gpu.report')"
             " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_every_foreign_variable_passes_the_cheap_look_before_the_tables():
    from otel_gpu.config.foreign import FOREIGN
    from otel_gpu.config.loading import FOREIGN_PREFIX, refuse_foreign_variables

    names = [name for row in FOREIGN for name in row.variables]
    assert names and all(name.startswith(FOREIGN_PREFIX) for name in names)
    with pytest.raises(Exception, match="DCGM_EXPORTER_LISTEN"):
        refuse_foreign_variables({"DCGM_EXPORTER_LISTEN": ":9401"})


_EVENTS_PROBE = """
import sys, time
from otel_gpu import sim
from otel_gpu.config import load
from otel_gpu.sample.library import Nvml
from otel_gpu.wiring import Service
sim.install(sim.FakeNvml(sim.load_scenario("t4")))
environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": sys.argv[1]} if sys.argv[1] else {}
config = load({"listen": "127.0.0.1:0", "pod_attribution": "false"}, environ=environ)
service = Service(config, Nvml(), environ=environ)
service.start()
deadline = time.monotonic() + 30
while service.store.latest is None and time.monotonic() < deadline:
    time.sleep(0.01)
print(service.store.latest is not None, "otel_gpu.export.events.detector" in sys.modules,
      "otel_gpu.export.http.basic_auth" in sys.modules, "hashlib" in sys.modules)
service.stop(0.5)
"""


@pytest.mark.parametrize(("endpoint", "loaded"), [
    ("", ["True", "False", "False", "False"]),
    # OTLP's HTTP client loads hashlib itself
    ("http://127.0.0.1:9", ["True", "True", "False", "True"])])
def test_a_collector_loads_what_it_uses_only(endpoint, loaded):
    """A simulated node without users or OTLP once held a mebibyte it never used: the GPU
    event detection only the OTLP logs pipeline reads (a third of one), the basic auth
    module and hashlib's OpenSSL binding (the simulator's uuid5 loaded it too)."""
    out = subprocess.run([sys.executable, "-c", _EVENTS_PROBE, endpoint], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == loaded
