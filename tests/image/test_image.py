"""The container image: built with the README's commands, run, and scraped.

No registry is reachable from the machines this runs on, so the base image is
made here: ``mmdebstrap`` writes a minimal Debian root with python3 and its venv
module, ``buildah`` imports it as an image. Its Debian release is chosen so that
its Python is not the host's: wheels built for the host's Python would not install
in it, as on a host with Python 3.11 and the default base's 3.12. The base also
carries the host's certificate authorities and a pip.conf naming them, as a
site's own base image would, so pip in the build reaches PyPI the way the host
does. Then the README's image commands run as written, each ``docker build``
carried out by ``buildah bud`` with ``BASE`` set to that image (the README asks
for the same BASE in each): the wheels stage exported to ``dist/wheels``, and
the build from those wheels alone, both from deploy/image/requirements.lock. The
packages in the image are then read and held to the lock's. ``buildah run`` then starts
``otel-gpu --simulate h100x8`` in the image, on the host's network, and
``/metrics`` is read from the host.

Opt-in (``pytest -m image``; ``scripts/test-image.sh`` installs buildah and
mmdebstrap and runs it): it needs root, Debian's mirror, PyPI, and a few minutes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.utils import canonicalize_name

from otel_gpu import __version__
from testkit.exposition import series
from testkit.process import http_get, wait_until
from tests.image.buildah import Buildah
from tests.image.recipe import ROOT, lock_reader, readme_commands

pytestmark = [pytest.mark.image, pytest.mark.timeout(1500)]

WHEELS = ROOT / "dist" / "wheels"  # where the README exports them, allowed by .dockerignore
BASE = "localhost/otel-gpu-test-base:latest"
# Debian release -> its python3: the base is one whose Python differs from the host's
RELEASES = {"trixie": (3, 13), "bookworm": (3, 11)}


def _step(timings: dict[str, float], name: str, started: float) -> None:
    timings[name] = round(time.monotonic() - started, 1)
    print(f"image test: {name} took {timings[name]} s", file=sys.stderr)


def _docker_shim(directory: Path, buildah: Buildah) -> Path:
    """A `docker` whose `build` is `buildah bud` on the test's storage and base."""
    directory.mkdir()
    bud = shlex.join(buildah.argv("bud", "--isolation", "chroot", "--layers",
                                  "--build-arg", f"BASE={BASE}"))
    shim = directory / "docker"
    shim.write_text(
        "#!/bin/sh\n"
        '[ "$1" = build ] || { echo "docker: only build is carried out here" >&2; exit 2; }\n'
        f'shift\nexec {bud} "$@"\n')
    shim.chmod(0o755)
    return directory


def _make_base(buildah: Buildah, work: Path) -> str:
    """The base image; returns its Debian release."""
    release = next(r for r, version in RELEASES.items() if version != sys.version_info[:2])
    tarball = work / "base.tar"
    made = subprocess.run(
        ["mmdebstrap", "--variant=apt", "--include=python3,python3-venv",
         "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
         "--dpkgopt=path-exclude=/usr/share/locale/*", release, str(tarball)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    assert made.returncode == 0, made.stderr[-4000:]
    pip_conf = work / "pip.conf"
    pip_conf.write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    scratch = buildah("from", "scratch")
    buildah("add", scratch, str(tarball), "/")
    buildah("add", scratch, "/etc/ssl/certs/ca-certificates.crt",
            "/etc/ssl/certs/ca-certificates.crt")
    buildah("add", scratch, str(pip_conf), "/etc/pip.conf")
    python = buildah("run", "--isolation", "chroot", scratch, "--", "python3", "-c",
                     "import sys; print(*sys.version_info[:2])")
    assert tuple(map(int, python.split())) == RELEASES[release], python
    buildah("commit", "-q", scratch, BASE)
    buildah("rm", scratch)
    return release


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(buildah, image, timings): the README's image commands, run once."""
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run scripts/test-image.sh, "
                    "which installs them")
    work = tmp_path_factory.mktemp("image")
    buildah = Buildah(work)
    timings: dict[str, float] = {}
    made_dist = not WHEELS.parent.exists()
    commands = readme_commands()
    try:
        started = time.monotonic()
        release = _make_base(buildah, work)
        _step(timings, f"base image ({release})", started)
        shutil.rmtree(WHEELS, ignore_errors=True)
        env = {**os.environ, "PATH": f"{_docker_shim(work / 'bin', buildah)}:{os.environ['PATH']}"}
        for command in commands:
            started = time.monotonic()
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=1200,
                                  stdin=subprocess.DEVNULL)
            assert done.returncode == 0, (
                f"the README's {command!r} exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
            _step(timings, command, started)
        assert sorted(p.name for p in WHEELS.glob("otel_gpu-*.whl")), "no wheel exported"
        tag = shlex.split(commands[-1])[shlex.split(commands[-1]).index("-t") + 1]
        yield buildah, f"localhost/{tag}", timings
    finally:
        shutil.rmtree(WHEELS, ignore_errors=True)
        if made_dist and WHEELS.parent.is_dir() and not any(WHEELS.parent.iterdir()):
            WHEELS.parent.rmdir()
        for args in (("rm", "--all"), ("rmi", "--all", "--force")):
            subprocess.run(buildah.argv(*args), capture_output=True, timeout=300)
        shutil.rmtree(work, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_image_runs_as_non_root_with_otel_gpu_as_entrypoint_and_no_compiler(built):
    buildah, image, _ = built
    config = json.loads(buildah("inspect", "--type", "image", image))["OCIv1"]["config"]
    assert config["Entrypoint"] == ["/opt/otel-gpu/bin/otel-gpu"]
    assert config["User"] == "65532:65532"  # numeric: no passwd entry needed
    container = buildah("from", image)
    try:
        run = ("run", "--isolation", "chroot", container, "--")
        assert buildah(*run, "id", "-u") == "65532"
        assert buildah(*run, "otel-gpu", "--version") == f"otel-gpu {__version__}"
        compilers = buildah(*run, "sh", "-c",
                            "for c in cc gcc c++ g++ clang; do command -v $c; done; true")
        assert compilers == ""
        assert buildah(*run, "sh", "-c", "command -v pip pip3; true") == ""
    finally:
        buildah("rm", container)


# Run by the image's own Python: its packages, and the values markers are evaluated with
# (packaging's default_environment, which the image does not have).
_INSTALLED = """
import importlib.metadata, json, os, platform, sys
print(json.dumps({
    "installed": {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()},
    "environment": {
        "implementation_name": sys.implementation.name,
        "implementation_version": platform.python_version(),
        "os_name": os.name, "platform_machine": platform.machine(),
        "platform_release": platform.release(), "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform}}))
"""


def test_the_image_holds_exactly_the_locks_versions_and_otel_gpu(built):
    buildah, image, _ = built
    container = buildah("from", image)
    try:
        found = json.loads(buildah("run", "--isolation", "chroot", container, "--",
                                   "/opt/otel-gpu/bin/python", "-c", _INSTALLED))
    finally:
        buildah("rm", container)
    environment = found["environment"]
    expected = {canonicalize_name(pin.name): pin.version
                for pin in lock_reader().read_lock()
                if not pin.marker or Marker(pin.marker).evaluate(environment)}
    expected["otel-gpu"] = __version__
    installed = {canonicalize_name(name): version
                 for name, version in found["installed"].items()}
    assert installed == expected  # pip and setuptools gone, nothing resolved anew


def test_the_image_serves_metrics_from_the_simulator(built):
    buildah, image, timings = built
    container = buildah("from", image)
    port = _free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        buildah.argv("run", "--isolation", "chroot", container, "--", "otel-gpu",
                     "--simulate", "h100x8", "--listen", f"127.0.0.1:{port}"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        def scraped():
            if proc.poll() is not None:
                raise AssertionError(f"the container exited {proc.returncode}:\n"
                                     f"{proc.stdout.read().decode(errors='replace')}")
            try:
                status, _, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except OSError:
                return None
            text = body.decode()
            return text if status == 200 and series(text, "hw_power_watts") else None

        text = wait_until(scraped, 60, "/metrics from the container")
        _step(timings, "first metrics from the container", started)
        assert len(series(text, "hw_power_watts")) == 8
        assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        buildah("rm", container)
    print(f"image test timings (s): {timings}", file=sys.stderr)
