"""The project's own Pod Resources schema: fresh stubs, kubelet wire compatibility.

The kubelet's own definitions are vendored under ``proto/kubelet/`` (see
``proto/README.md`` for where they come from), so the compatibility check runs in
every clone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
from otel_gpu.attribute.k8s._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from otel_gpu.attribute.k8s.kubelet_rpc import RPC_METHODS

ROOT = Path(__file__).resolve().parents[3]
GEN = ROOT / "scripts" / "gen_proto.py"
STUBS = ROOT / "otel_gpu" / "attribute" / "k8s" / "_proto"
KUBELET = ROOT / "proto" / "kubelet" / "podresources"
"""The kubelet's api.proto files, unchanged (proto/README.md)."""
PROTOC_PYTHON = os.environ.get("PROTOC_PYTHON") or sys.executable
"""A Python with grpcio-tools (scripts/gen_proto.py says why it may be another one)."""


def run_gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GEN), *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_checked_in_stubs_are_fresh() -> None:
    result = run_gen("--check")
    assert result.returncode == 0, result.stderr


def test_check_detects_stale_stubs(tmp_path) -> None:
    copy = tmp_path / "_proto"
    shutil.copytree(STUBS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert run_gen("--check", "--out", str(copy)).returncode == 0
    stub = copy / "podresources" / "v1" / "api_pb2.py"
    stub.write_text(stub.read_text() + "# edited\n")
    (copy / "podresources" / "v1alpha1" / "stray_pb2.py").write_text("")
    result = run_gen("--check", "--out", str(copy))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "api_pb2.py" in lines[0] and "stray_pb2.py" in lines[0]
    # Regenerating into the copy repairs it (and removes the stray stub).
    assert run_gen("--out", str(copy)).returncode == 0
    assert run_gen("--check", "--out", str(copy)).returncode == 0
    assert not (copy / "podresources" / "v1alpha1" / "stray_pb2.py").exists()


def test_descriptor_pool_names_do_not_collide() -> None:
    assert v1_pb2.DESCRIPTOR.name == "podresources/v1/api.proto"
    assert v1alpha1_pb2.DESCRIPTOR.name == "podresources/v1alpha1/api.proto"
    assert v1_pb2.DESCRIPTOR.package == "v1"
    assert v1alpha1_pb2.DESCRIPTOR.package == "v1alpha1"


def test_rpc_paths_are_the_kubelets() -> None:
    assert set(RPC_METHODS.values()) == {
        "/v1.PodResourcesLister/List",
        "/v1.PodResourcesLister/GetAllocatableResources",
        "/v1alpha1.PodResourcesLister/List",
    }
    service = v1_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]


def _shape(fdp: descriptor_pb2.FileDescriptorProto) -> dict:
    """Everything on the wire or in a method path; comments and options excluded."""
    def fields(msg):
        return {
            f.number: (f.name, f.type, f.label, f.type_name, f.proto3_optional)
            for f in msg.field
        }
    return {
        "package": fdp.package,
        "syntax": fdp.syntax,
        "messages": {m.name: fields(m) for m in fdp.message_type},
        "services": {
            s.name: {m.name: (m.input_type, m.output_type) for m in s.method}
            for s in fdp.service
        },
    }


@pytest.mark.parametrize(("version", "module"), [("v1", v1_pb2), ("v1alpha1", v1alpha1_pb2)])
def test_wire_compatible_with_kubelet_schema(version: str, module, tmp_path) -> None:
    out = tmp_path / "ref.pb"
    subprocess.run(
        [PROTOC_PYTHON, "-m", "grpc_tools.protoc", f"-I{KUBELET / version}",
         f"--descriptor_set_out={out}", "api.proto"],
        check=True, timeout=60,
    )  # fmt: skip
    reference = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    ours = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(ours)
    assert _shape(ours) == _shape(reference)


def test_the_kubelets_files_are_vendored_unchanged() -> None:
    """Its own header, no comment of ours: a copy, where proto/README.md says it is from."""
    for version in ("v1", "v1alpha1"):
        text = (KUBELET / version / "api.proto").read_text()
        assert text.startswith("// To regenerate api.pb.go run"), version
        assert f'option go_package = "k8s.io/kubelet/pkg/apis/podresources/{version}";' in text
        assert "otel-gpu" not in text
    readme = (ROOT / "proto" / "README.md").read_text()
    assert "Apache License" in readme and "kubernetes/kubelet" in readme


def test_a_difference_on_the_wire_fails_the_comparison(tmp_path) -> None:
    """The comparison can fail: a field renumbered in a copy of ours is told apart."""
    edited = tmp_path / "v1"
    edited.mkdir()
    ours = (ROOT / "proto" / "podresources" / "v1" / "api.proto").read_text()
    assert ours.count("int64 ID = 1;") == 1  # NUMANode's one field
    (edited / "api.proto").write_text(ours.replace("int64 ID = 1;", "int64 ID = 9;"))

    def shape_of(directory: Path) -> dict:
        out = tmp_path / f"{directory.name}.pb"
        subprocess.run([PROTOC_PYTHON, "-m", "grpc_tools.protoc", f"-I{directory}",
                        f"--descriptor_set_out={out}", "api.proto"], check=True, timeout=60)
        return _shape(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0])

    assert shape_of(edited) != shape_of(KUBELET / "v1")

