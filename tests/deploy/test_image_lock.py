"""The image's lock (deploy/image/requirements.lock) against pyproject.toml, without
building: every runtime dependency pinned inside its declared range, nothing the runtime
does not pull in, every pin exact and hashed, the Dockerfile installing it with hashes
required, and scripts/lock_constraints.py turning it into constraints. The image test
(tests/image) holds the built image to it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.image.recipe import LOCK, ROOT, dockerfile_stages, lock_reader

PYPROJECT = "otel-gpu (pyproject.toml)"  # how uv's `# via` names otel-gpu itself
CONSTRAINTS = ROOT / "scripts" / "lock_constraints.py"


def _runtime() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(line) for line in project["dependencies"]]
    return {canonicalize_name(r.name): r for r in requirements}


def _pins():
    return {canonicalize_name(pin.name): pin for pin in lock_reader().read_lock()}


def test_every_pin_is_one_exact_version_with_sha256_hashes():
    pins = lock_reader().read_lock()
    assert pins, f"{LOCK} pins nothing"
    names = [canonicalize_name(pin.name) for pin in pins]
    assert len(names) == len(set(names)), "a package pinned twice"
    for pin in pins:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+",
                            pin.requirement), pin
        assert pin.hashes, f"{pin.requirement}: no --hash"
        for digest in pin.hashes:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), (pin.requirement, digest)


def test_every_runtime_dependency_is_locked_inside_pyprojects_range():
    pins = _pins()
    for name, requirement in _runtime().items():
        assert name in pins, f"{requirement} is not in {LOCK.name}: run scripts/lock-image.sh"
        pin = pins[name]
        assert requirement.specifier.contains(pin.version, prereleases=True), (
            f"{pin.requirement} is outside pyproject.toml's {requirement}: "
            "run scripts/lock-image.sh")
        assert PYPROJECT in pin.via, pin


def test_the_lock_holds_only_what_the_runtime_dependencies_pull_in():
    """uv's `# via` says what requires each pin: otel-gpu itself only for pyproject's
    runtime dependencies (a test extra's package, or one dropped from pyproject, shows up
    here), and every other pin is required by one in the lock."""
    pins = _pins()
    runtime = _runtime()
    direct = {name for name, pin in pins.items() if PYPROJECT in pin.via}
    assert direct == set(runtime), "the lock was made from other dependencies than " \
        "pyproject.toml's: run scripts/lock-image.sh"
    for name, pin in pins.items():
        assert pin.via, f"{pin.requirement}: no `# via`, so not made by scripts/lock-image.sh"
        parents = {canonicalize_name(v) for v in pin.via if v != PYPROJECT}
        assert parents <= set(pins), f"{name} is required by {parents - set(pins)}, not locked"


def test_the_lock_says_how_it_was_made_and_the_refresh_script_reads_pyproject():
    header = LOCK.read_text().split("\n\n", 1)[0]
    assert "scripts/lock-image.sh" in header and "--generate-hashes" in header, header
    script = ROOT / "scripts" / "lock-image.sh"
    assert os.access(script, os.X_OK)
    assert re.search(r"uv\" pip compile pyproject\.toml .*--universal", script.read_text())


def test_the_dockerfile_installs_the_lock_with_hashes_required_and_the_context_holds_it():
    (build,) = [s for s in dockerfile_stages().values() if s.name == "build"]
    text = " ".join(build.lines)
    lock = f"-r /src/{LOCK.relative_to(ROOT)}"
    installs = re.findall(r"pip install [^&]*", text)
    (from_lock,) = [i for i in installs if lock in i]
    assert "--require-hashes" in from_lock and "--no-deps" in from_lock, from_lock
    assert [i for i in installs if i.rstrip().endswith(" otel-gpu") and "--no-deps" in i]
    (fetch,) = [w for w in re.findall(r"pip wheel [^&;]*", text) if lock in w]
    assert "--require-hashes" in fetch, fetch
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert f"!{LOCK.relative_to(ROOT)}" in ignore, "the build context leaves the lock out"


def test_the_constraints_are_the_locks_pins_without_hashes():
    done = subprocess.run([sys.executable, str(CONSTRAINTS)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [pin.constraint() for pin in lock_reader().read_lock()]
    for line in lines:
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==" and "--hash" not in line, line


def test_the_constraints_keep_markers_and_read_any_lock(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "# made by hand\n"
        "alpha==1.0 ; python_full_version < '3.12' \\\n"
        "    --hash=sha256:" + "a" * 64 + " \\\n"
        "    --hash=sha256:" + "b" * 64 + "\n"
        "    # via\n"
        "    #   otel-gpu (pyproject.toml)\n"
        "    #   beta\n"
        "beta==2.0rc1 --hash=sha256:" + "c" * 64 + "\n"
        "    # via otel-gpu (pyproject.toml)\n")
    (alpha, beta) = lock_reader().read_lock(lock)
    assert (alpha.name, alpha.version, alpha.marker) == ("alpha", "1.0",
                                                         "python_full_version < '3.12'")
    assert alpha.hashes == ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
    assert alpha.via == [PYPROJECT, "beta"] and beta.via == [PYPROJECT]
    done = subprocess.run([sys.executable, str(CONSTRAINTS), str(lock)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["alpha==1.0 ; python_full_version < '3.12'",
                                        "beta==2.0rc1"]
