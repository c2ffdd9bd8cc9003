"""The image commands the README documents, the Dockerfile's stages, and its lock."""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy" / "image" / "requirements.lock"


def lock_reader():
    """scripts/lock_constraints.py (a script, not a package), whose read_lock reads LOCK."""
    name = "lock_constraints"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, ROOT / "scripts" / "lock_constraints.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def readme_commands() -> list[str]:
    """The commands of the README's container image block, one a line."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("**Container image.**"):]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block, "no sh block after **Container image.** in README.md"
    return [line.strip() for line in block[1].splitlines() if line.strip()]


@dataclass
class Stage:
    name: str
    base: str  # the FROM image or stage
    lines: list[str] = field(default_factory=list)

    def copies_from(self) -> list[str]:
        return [m for line in self.lines for m in re.findall(r"COPY --from=(\S+)", line)]


def dockerfile_stages() -> dict[str, Stage]:
    """The Dockerfile's stages by name (an unnamed one by its position), in order."""
    stages: dict[str, Stage] = {}
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        match = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, flags=re.I)
        if match:
            name = match[2] or str(len(stages))
            stages[name] = Stage(name, match[1])
        elif stages:
            stages[list(stages)[-1]].lines.append(line.strip())
    return stages
