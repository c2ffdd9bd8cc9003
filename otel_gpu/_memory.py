"""Large buffers go back to the system when freed (glibc's malloc, set once at start-up).

Every publication writes the exposition (megabytes at a large node), its gzip
and, for OTLP, a request, and drops the last ones. glibc serves a large
allocation from its own mapping and unmaps it when freed, but after the first
such free it raises that threshold to the freed size, so every later body is
carved from the heap, whose freed middle is never returned: at 256 GPUs the
process kept about 30 MiB more resident than it used. Fixing the threshold at
glibc's own default keeps large buffers mapped, for one ``mmap`` and one
``munmap`` each per body. Elsewhere (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter (malloc.h)."""
MMAP_THRESHOLD = 128 * 1024
"""glibc's default threshold: allocations from this size on are their own mapping."""


def return_large_buffers() -> bool:
    """Fix glibc's mapping threshold; whether it was set (False off glibc, or refused)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError) as exc:  # no symbol table to look in, or no mallopt
        log.debug("malloc's mapping threshold not set: %s", exc)
        return False
