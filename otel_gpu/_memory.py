"""Memory freed goes back to the system (glibc's malloc, set up once at start-up).

Every publication writes the exposition (megabytes at a large node), its gzip
and, for OTLP, a request, and drops the last ones. glibc serves a large
allocation from its own mapping and unmaps it when freed, but after the first
such free it raises that threshold to the freed size, so every later body is
carved from the heap, whose freed middle is never returned: at 256 GPUs the
process kept about 30 MiB more resident than it used. Fixing the threshold at
glibc's own default keeps large buffers mapped, for one ``mmap`` and one
``munmap`` each per body. And one heap serves every thread: glibc gives each
thread that allocates a heap of its own (an arena) to spare threads a lock,
but these threads allocate while holding Python's own lock anyway, and each
arena keeps its own free pages (about 1 MiB at one GPU). Elsewhere (musl,
macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameters (malloc.h)."""
MMAP_THRESHOLD = 128 * 1024
"""glibc's default threshold: allocations from this size on are their own mapping."""


def return_freed_memory() -> bool:
    """Fix glibc's mapping threshold and keep one arena (before any thread starts);
    whether both were set (False off glibc, or refused)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
        return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) & bool(mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError) as exc:  # no symbol table to look in, or no mallopt
        log.debug("malloc's mapping threshold not set: %s", exc)
        return False
