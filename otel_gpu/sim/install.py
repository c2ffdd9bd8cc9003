"""Putting a fake driver under pynvml, and taking it away again.

pynvml loads libnvidia-ml once into ``pynvml.nvmlLib`` and caches every
function it looks up there; swapping that object (and emptying the cache),
under pynvml's own load lock, is all it takes for every later pynvml call to
reach the fake. :func:`uninstall` restores what was there before, so tests
can install a fresh fake each time.
"""

from __future__ import annotations

import threading
from typing import Any

import pynvml

from otel_gpu.sim.driver import FakeNvml

_saved: tuple[Any, int] | None = None
_install_lock = threading.Lock()


def install(fake: FakeNvml) -> None:
    """Make pynvml call ``fake`` instead of libnvidia-ml; ``uninstall`` restores."""
    global _saved
    with _install_lock, pynvml.libLoadLock:
        if _saved is None:
            _saved = (pynvml.nvmlLib, pynvml._nvmlLib_refcount)
        pynvml.nvmlLib = fake
        pynvml._nvmlGetFunctionPointer_cache.clear()


def uninstall() -> None:
    """Put back whatever pynvml had before the first :func:`install`."""
    global _saved
    with _install_lock, pynvml.libLoadLock:
        if _saved is None:
            return
        pynvml.nvmlLib, pynvml._nvmlLib_refcount = _saved
        pynvml._nvmlGetFunctionPointer_cache.clear()
        _saved = None
