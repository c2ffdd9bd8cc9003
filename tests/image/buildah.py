"""``buildah`` driven by the image tests, on storage of their own."""

from __future__ import annotations

import subprocess
from pathlib import Path


class Buildah:
    """``buildah`` with its own storage (vfs) under one directory, removed afterwards."""

    def __init__(self, work: Path) -> None:
        self.prefix = ["buildah", "--root", str(work / "storage"), "--runroot",
                       str(work / "run"), "--storage-driver", "vfs"]

    def argv(self, *args: str) -> list[str]:
        return [*self.prefix, *args]

    def __call__(self, *args: str, timeout: float = 900) -> str:
        done = subprocess.run(self.argv(*args), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (
            f"buildah {' '.join(args)} exited {done.returncode}:\n"
            f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done.stdout.strip()
