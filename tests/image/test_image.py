"""The container image: built from the project's Dockerfile, run, and scraped.

No registry is reachable from the machines this runs on, so the base image is
made here: ``mmdebstrap`` writes a minimal Debian root with python3 and its venv
module, ``buildah`` imports it as an image, then builds the Dockerfile unchanged
with ``BASE`` set to that image. PyPI is not reachable from inside the build
either (the build has none of the host's certificate authorities or package
mirrors), so the wheels are collected on the host for the base's Python and
platform and handed to the build with ``WHEELS``. Then ``buildah run`` starts
``otel-gpu --simulate h100x8`` in the image, on the host's network, and
``/metrics`` is read from the host.

Opt-in (``pytest -m image``; ``scripts/test-image.sh`` installs buildah and
mmdebstrap and runs it): it needs root, Debian's mirror, and a few minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_gpu import __version__
from tests.support.exposition import series
from tests.support.process import http_get, wait_until

pytestmark = [pytest.mark.image, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
WHEELS = "dist/wheels"  # inside the build context, allowed by .dockerignore
BASE = "localhost/otel-gpu-test-base:bookworm"
IMAGE = "localhost/otel-gpu:test"


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


def _step(timings: dict[str, float], name: str, started: float) -> None:
    timings[name] = round(time.monotonic() - started, 1)
    print(f"image test: {name} took {timings[name]} s", file=sys.stderr)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(buildah, timings): the base image and the project's image, built once."""
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run scripts/test-image.sh, "
                    "which installs them")
    work = tmp_path_factory.mktemp("image")
    buildah = Buildah(work)
    timings: dict[str, float] = {}
    wheels = ROOT / WHEELS
    made_dist = not wheels.parent.exists()
    try:
        started = time.monotonic()
        tarball = work / "base.tar"
        made = subprocess.run(
            ["mmdebstrap", "--variant=apt", "--include=python3,python3-venv",
             "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
             "--dpkgopt=path-exclude=/usr/share/locale/*", "bookworm", str(tarball)],
            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )
        assert made.returncode == 0, made.stderr[-4000:]
        _step(timings, "mmdebstrap", started)

        started = time.monotonic()
        scratch = buildah("from", "scratch")
        buildah("add", scratch, str(tarball), "/")
        # the wheels must suit the base's Python and C library, whatever the host runs
        python, libc = buildah(
            "run", "--isolation", "chroot", scratch, "--", "python3", "-c",
            "import platform, sys; "
            "print(f'{sys.version_info[0]}.{sys.version_info[1]}', platform.libc_ver()[1])",
        ).split()
        buildah("commit", "-q", scratch, BASE)
        buildah("rm", scratch)
        _step(timings, "base image", started)

        started = time.monotonic()
        shutil.rmtree(wheels, ignore_errors=True)
        pip = [sys.executable, "-m", "pip"]
        source = work / "source"  # a copy: setuptools leaves build/ where it builds
        shutil.copytree(ROOT / "otel_gpu", source / "otel_gpu",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy2(ROOT / name, source / name)
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
                       check=True, timeout=300, stdin=subprocess.DEVNULL)
        own = next(wheels.glob("otel_gpu-*.whl"))
        machine = os.uname().machine
        glibc_minor = int(libc.split(".")[1])
        platforms = [f"manylinux2014_{machine}"] + [
            f"manylinux_2_{minor}_{machine}" for minor in range(17, glibc_minor + 1)]
        subprocess.run(
            [*pip, "download", "-q", "--only-binary=:all:", "--python-version", python,
             "--implementation", "cp", *(a for p in platforms for a in ("--platform", p)),
             "-d", str(wheels), str(own)],
            check=True, timeout=300, stdin=subprocess.DEVNULL,
        )
        _step(timings, "wheels", started)

        started = time.monotonic()
        buildah("bud", "--isolation", "chroot", "--build-arg", f"BASE={BASE}",
                "--build-arg", f"WHEELS={WHEELS}", "-f", str(ROOT / "Dockerfile"),
                "-t", IMAGE, str(ROOT))
        _step(timings, "build", started)
        yield buildah, timings
    finally:
        shutil.rmtree(wheels, ignore_errors=True)
        if made_dist and wheels.parent.is_dir() and not any(wheels.parent.iterdir()):
            wheels.parent.rmdir()
        for args in (("rm", "--all"), ("rmi", "--all", "--force")):
            subprocess.run(buildah.argv(*args), capture_output=True, timeout=300)
        shutil.rmtree(work, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_image_runs_as_non_root_with_otel_gpu_as_entrypoint_and_no_compiler(built):
    buildah, _ = built
    config = json.loads(buildah("inspect", "--type", "image", IMAGE))["OCIv1"]["config"]
    assert config["Entrypoint"] == ["/opt/otel-gpu/bin/otel-gpu"]
    assert config["User"] == "65532:65532"  # numeric: no passwd entry needed
    container = buildah("from", IMAGE)
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


def test_the_image_serves_metrics_from_the_simulator(built):
    buildah, timings = built
    container = buildah("from", IMAGE)
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
