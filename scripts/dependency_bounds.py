#!/usr/bin/env python3
"""The two ends of pyproject.toml's runtime dependency ranges, for the CI jobs that prove them.

    python3 scripts/dependency_bounds.py lowest       # pip constraints: each lower bound, ==
    python3 scripts/dependency_bounds.py report MODE  # the versions installed, checked
    python3 scripts/dependency_bounds.py extra NAME   # an optional extra's requirements

``lowest`` prints one ``name==version`` line per runtime dependency, read from
pyproject.toml (never written by hand), for ``pip install -c``. ``report`` prints the
installed version of each runtime dependency beside its declared range and fails when
one is outside it, or, for ``lowest``, when one is not its lower bound. For ``newest``
it also asks pip which release each range allows, each dependency alone, and names any
held back by another one (a warning: the pin is upstream's, not ours). Standard library
only, so it runs before anything is installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

# A runtime requirement as this project writes them: a name, a lower bound, an upper one.
_REQUIREMENT = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*>=\s*(?P<low>[0-9][0-9A-Za-z.]*)\s*,\s*<\s*"
    r"(?P<high>[0-9][0-9A-Za-z.]*)$")


class BoundsError(ValueError):
    """pyproject.toml says something the jobs cannot prove (a one-line message)."""


def runtime_ranges(pyproject: Path = PYPROJECT) -> list[tuple[str, str, str]]:
    """(name, lowest, upper-exclusive) for each runtime dependency, in pyproject's order."""
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    ranges = []
    for dep in deps:
        match = _REQUIREMENT.match(dep.strip())
        if match is None:
            raise BoundsError(f"{pyproject.name}: {dep!r} is not 'name>=LOW,<HIGH'; "
                              "every runtime dependency needs both ends for CI to prove")
        ranges.append((match["name"], match["low"], match["high"]))
    return ranges


def extra(name: str, pyproject: Path = PYPROJECT) -> str:
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"].get(
        "optional-dependencies", {})
    if name not in extras:
        raise BoundsError(f"{pyproject.name} has no extra {name!r}")
    return "".join(f"{requirement}\n" for requirement in extras[name])


def lowest_constraints(pyproject: Path = PYPROJECT) -> str:
    return "".join(f"{name}=={low}\n" for name, low, _ in runtime_ranges(pyproject))


def _key(version: str) -> tuple[int, ...]:
    """A release's numeric key (the ranges here name plain releases)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("b")[0].split("rc")[0]))


def _newest_allowed(python: str, requirements: list[str]) -> dict[str, str]:
    """What pip would install for each requirement alone: the newest release its range allows."""
    found = {}
    for requirement in requirements:
        out = subprocess.run(
            [python, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps",
             "--ignore-installed", "--report", "-", requirement],
            capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            print(f"warning: pip could not say the newest release of {requirement}: "
                  f"{out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        for item in json.loads(out.stdout)["install"]:
            meta = item["metadata"]
            found[_normal(meta["name"])] = meta["version"]
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def report(mode: str, pyproject: Path = PYPROJECT) -> int:
    """Print each runtime dependency's installed version; non-zero when the job's promise fails."""
    ranges = runtime_ranges(pyproject)
    newest = (_newest_allowed(sys.executable, [f"{n}>={lo},<{hi}" for n, lo, hi in ranges])
              if mode == "newest" else {})
    failed = 0
    print(f"dependencies ({mode}), Python {sys.version.split()[0]}:")
    for name, low, high in ranges:
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            print(f"  {name:42} NOT INSTALLED  (declared >={low},<{high})")
            failed += 1
            continue
        note = ""
        if not _key(low) <= _key(installed) < _key(high):
            note, failed = "  OUTSIDE the declared range", failed + 1
        elif mode == "lowest" and _key(installed) != _key(low):
            note, failed = f"  NOT the lower bound {low}", failed + 1
        elif mode == "newest" and _normal(name) in newest and newest[_normal(name)] != installed:
            note = f"  (warning: {newest[_normal(name)]} is allowed, held back by another pin)"
        print(f"  {name:42} {installed:14} declared >={low},<{high}{note}")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["lowest"] and len(argv) == 1:
            sys.stdout.write(lowest_constraints())
            return 0
        if argv[:1] == ["extra"] and len(argv) == 2:
            sys.stdout.write(extra(argv[1]))
            return 0
        if argv[:1] == ["report"] and len(argv) == 2 and argv[1] in ("lowest", "newest", "any"):
            return report(argv[1])
    except BoundsError as exc:
        print(f"dependency_bounds: {exc}", file=sys.stderr)
        return 2
    print("usage: dependency_bounds.py lowest | report lowest|newest|any | extra NAME",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
