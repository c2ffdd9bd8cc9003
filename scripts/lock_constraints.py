"""The image's lock (deploy/image/requirements.lock) as a pip constraints file.

Prints one ``name==version`` line a package (with its environment marker, if any) and no
hashes, so that the test suite can be installed with exactly the versions the image
holds; the test extra's own packages stay free within pyproject.toml's ranges:

    python3 scripts/lock_constraints.py > image-constraints.txt
    .venv/bin/python -m pip install -c image-constraints.txt -e '.[test]'

Hashes are left out: with one in a constraints file, pip wants every package it installs
pinned and hashed, the test extra's too.
Standard library only: it runs before any environment is made. ``read_lock`` is what the
tests read the lock with.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

LOCK = Path(__file__).resolve().parents[1] / "deploy" / "image" / "requirements.lock"


@dataclass
class Pin:
    requirement: str  # "name==version", as written
    marker: str  # "" when it applies everywhere
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)  # what requires it, from uv's comments

    @property
    def name(self) -> str:
        return self.requirement.split("==", 1)[0].strip()

    @property
    def version(self) -> str:
        return self.requirement.split("==", 1)[1].strip() if "==" in self.requirement else ""

    def constraint(self) -> str:
        return f"{self.requirement} ; {self.marker}" if self.marker else self.requirement


def read_lock(path: Path = LOCK) -> list[Pin]:
    """The lock's requirements, in order: continuation lines joined, and the comments
    under each (``# via NAME`` or ``# via`` then ``#   NAME`` lines) kept as its via."""
    pins: list[Pin] = []
    logical = ""
    for raw in path.read_text().splitlines():
        text = raw.strip()
        if text.startswith("#"):
            comment = text.lstrip("#").strip()
            if pins and not logical and (raw[0].isspace() or comment.startswith("via")):
                name = comment.removeprefix("via").strip()
                if name:
                    pins[-1].via.append(name)
            continue
        text = text.split(" #", 1)[0].strip()
        if text.endswith("\\"):
            logical += text[:-1] + " "
            continue
        logical += text
        if logical.strip():
            pins.append(_parse(logical))
        logical = ""
    if logical.strip():
        pins.append(_parse(logical))
    return pins


def _parse(logical: str) -> Pin:
    words = logical.split()
    hashes = [w.removeprefix("--hash=") for w in words if w.startswith("--hash=")]
    others = [w for w in words if not w.startswith("--")]
    requirement, _, marker = " ".join(others).partition(";")
    return Pin(requirement.strip(), marker.strip(), hashes)


def main(argv: list[str]) -> int:
    if len(argv) > 1 or argv[:1] in (["-h"], ["--help"]):
        print("usage: python3 scripts/lock_constraints.py [LOCK] > constraints.txt",
              file=sys.stderr)
        return 2
    path = Path(argv[0]) if argv else LOCK
    for pin in read_lock(path):
        print(pin.constraint())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
