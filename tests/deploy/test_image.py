"""The image to run: no image is published, so the chart refuses to render without one
(one line saying what to set), the kustomize base names a placeholder no registry
serves, the README's kustomize overlay sets the image as written, and
scripts/push-image.sh builds and pushes to the registry it is given."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.helpers import CHART, DEPLOY, ROOT, documents, helm_binary, tool

REGISTRY_IMAGE = "registry.example.com/otel-gpu"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
PUSH = ROOT / "scripts" / "push-image.sh"


def _helm_template(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_binary(), "template", "gpu", str(CHART), *args],
                          capture_output=True, text=True, timeout=120)


def _image(objects: list[dict]) -> str:
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return container["image"]


# --- the chart ---------------------------------------------------------------------------

def test_the_chart_refuses_to_render_without_an_image_saying_what_to_set():
    proc = _helm_template()
    assert proc.returncode != 0, "rendered without an image"
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert line.endswith(
        "image.repository is not set: push the image with scripts/push-image.sh "
        f"REGISTRY/otel-gpu:{APP_VERSION}, then --set image.repository=REGISTRY/otel-gpu"), line
    assert proc.stdout == ""


def test_the_chart_renders_the_image_it_is_given():
    proc = _helm_template("--set", f"image.repository={REGISTRY_IMAGE}")
    assert proc.returncode == 0, proc.stderr
    assert _image(documents(proc.stdout)) == f"{REGISTRY_IMAGE}:{APP_VERSION}"
    proc = _helm_template("--set", "image.repository=localhost:5000/gpu/otel-gpu",
                          "--set", "image.tag=0.2.0-rc1")
    assert proc.returncode == 0, proc.stderr
    assert _image(documents(proc.stdout)) == "localhost:5000/gpu/otel-gpu:0.2.0-rc1"


@pytest.mark.parametrize("value", ["image.repository=registry.example.com/otel-gpu:1.0",
                                   "image.repository=registry.example.com/otel gpu",
                                   "image.tag=v1:2"])
def test_a_repository_with_a_tag_or_a_bad_tag_is_refused_by_the_schema(value):
    proc = _helm_template("--set", f"image.repository={REGISTRY_IMAGE}", "--set", value)
    assert proc.returncode != 0, value
    assert "don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert f"- {value.split('=')[0]}:" in proc.stderr, proc.stderr


def test_lint_still_passes_on_the_bare_chart():
    """helm lint (and chart-testing) renders without values: `required` only informs there."""
    proc = subprocess.run([helm_binary(), "lint", "--strict", str(CHART)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Missing required value: image.repository is not set" in proc.stdout + proc.stderr


# --- kustomize ---------------------------------------------------------------------------

def _kustomize(path: Path) -> list[dict]:
    kubectl = tool("kubectl", "any kubectl since 1.14 has kustomize built in")
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return documents(proc.stdout)


def test_the_kustomize_base_names_a_placeholder_no_registry_serves():
    image = _image(_kustomize(DEPLOY / "kustomize" / "base"))
    host = image.split("/", 1)[0]
    assert host.endswith(".invalid"), image  # RFC 2606: never resolves
    assert image == f"your-registry.invalid/otel-gpu:{APP_VERSION}"


def _readme_kustomize_block() -> str:
    text = (ROOT / "README.md").read_text()
    deploy = text[text.index("## Deploy"):]
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", deploy, flags=re.S)
              if "kubectl apply -k" in b]
    assert len(blocks) == 1, blocks
    return blocks[0]


def test_the_readmes_kustomize_overlay_as_written_sets_the_image(tmp_path):
    """Run the README's block as written, in a directory laid out like the repository,
    with `kubectl apply -k DIR` answered by `kubectl kustomize DIR`."""
    real = tool("kubectl", "any kubectl since 1.14 has kustomize built in")
    block = _readme_kustomize_block()
    work = tmp_path / "clone"
    work.mkdir()
    (work / "deploy").symlink_to(DEPLOY)
    shims = tmp_path / "bin"
    shims.mkdir()
    built = tmp_path / "applied.yaml"
    (shims / "kubectl").write_text(
        "#!/bin/sh\n"
        '[ "$1 $2" = "apply -k" ] || { echo "unexpected: kubectl $*" >&2; exit 2; }\n'
        f'exec {real} kustomize "$3" > {built}\n')
    (shims / "kubectl").chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    objects = documents(built.read_text())
    assert _image(objects) == f"{REGISTRY_IMAGE}:{APP_VERSION}"
    assert {o["kind"] for o in objects} >= {"DaemonSet", "Service", "ConfigMap", "Namespace"}


# --- scripts/push-image.sh ---------------------------------------------------------------

def _push(tmp_path, *args: str, tool_name: str = "docker", env: dict | None = None):
    """Run the script with a stand-in container tool that logs its arguments."""
    shims = tmp_path / "bin"
    shims.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    shim = shims / tool_name
    shim.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {log}\n')
    shim.chmod(0o755)
    environ = {"PATH": f"{shims}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(tmp_path),
               "CONTAINER_TOOL": tool_name, **(env or {})}
    proc = subprocess.run(["bash", str(PUSH), *args], env=environ, capture_output=True,
                          text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def test_the_readmes_push_command_is_the_script():
    text = (ROOT / "README.md").read_text()
    assert f"scripts/push-image.sh {REGISTRY_IMAGE}:{APP_VERSION}" in text
    assert os.access(PUSH, os.X_OK)


@pytest.mark.parametrize("tool_name", ["docker", "podman"])
def test_push_builds_from_the_dockerfile_and_pushes_the_tag(tmp_path, tool_name):
    proc, calls = _push(tmp_path, f"{REGISTRY_IMAGE}:{APP_VERSION}", tool_name=tool_name)
    assert proc.returncode == 0, proc.stderr
    image = f"{REGISTRY_IMAGE}:{APP_VERSION}"
    assert calls == [f"{tool_name} build -t {image} -f Dockerfile .",
                     f"{tool_name} push {image}"]
    assert f"--set image.repository={REGISTRY_IMAGE} --set image.tag={APP_VERSION}" in (
        proc.stdout)


def test_push_with_buildah_names_the_registry_destination(tmp_path):
    proc, calls = _push(tmp_path, "localhost:5000/otel-gpu:dev", tool_name="buildah",
                        env={"BASE": "python:3.11-slim-bookworm", "PLATFORM": "linux/arm64"})
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        "buildah build --build-arg BASE=python:3.11-slim-bookworm --platform linux/arm64 "
        "-t localhost:5000/otel-gpu:dev -f Dockerfile .",
        "buildah push localhost:5000/otel-gpu:dev docker://localhost:5000/otel-gpu:dev"]


def test_push_without_a_tag_uses_the_charts_version(tmp_path):
    proc, calls = _push(tmp_path, "registry.example.com:5000/otel-gpu")
    assert proc.returncode == 0, proc.stderr
    assert calls[-1] == f"docker push registry.example.com:5000/otel-gpu:{APP_VERSION}"


@pytest.mark.parametrize(("ref", "says"), [
    ("otel-gpu:0.1.0", "name the registry"),
    ("someone/otel-gpu:0.1.0", "name the registry"),
    (f"{REGISTRY_IMAGE}@sha256:{'0' * 64}", "not a digest"),
    (f"{REGISTRY_IMAGE}:-bad", "not a valid tag"),
])
def test_push_refuses_a_reference_it_cannot_push_in_one_line(tmp_path, ref, says):
    proc, calls = _push(tmp_path, ref)
    assert proc.returncode == 2, proc.stdout
    assert calls == []
    (line,) = proc.stderr.splitlines()
    assert line.startswith("push-image: ") and says in line, line


def test_push_without_an_argument_prints_its_usage(tmp_path):
    proc, calls = _push(tmp_path)
    assert proc.returncode == 2 and calls == []
    assert "usage: scripts/push-image.sh REGISTRY/NAME[:TAG]" in proc.stderr
