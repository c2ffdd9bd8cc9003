"""Device id parsing and resolution: every format the kubelet passes through."""

from __future__ import annotations

import pytest

from otel_gpu.attribute.k8s.device_ids import (
    DRA_GPU,
    DRA_MIG,
    GPU,
    MIG,
    MINOR,
    DeviceRef,
    DeviceResolver,
    ResourceFilter,
    parse_device_id,
    parse_dra_device,
)
from tests.support.snapshots import GPU0, GPU1, GPU2, MIG_A, MIG_B, MIG_C, gpu_device, mig_device


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (GPU0, DeviceRef(GPU, uuid=GPU0)),
        (f"{GPU0}::3", DeviceRef(GPU, uuid=GPU0, replica=3)),
        (MIG_A, DeviceRef(MIG, uuid=MIG_A)),
        (f"{MIG_A}::7", DeviceRef(MIG, uuid=MIG_A, replica=7)),
        (
            f"MIG-{GPU1}/3/0",
            DeviceRef(MIG, uuid=GPU1, gpu_instance_id=3, compute_instance_id=0),
        ),
        ("nvidia0", DeviceRef(MINOR, minor=0)),
        ("nvidia12", DeviceRef(MINOR, minor=12)),
        ("nvidia0/gi1", DeviceRef(MINOR, minor=0, gpu_instance_id=1)),
        ("nvidia1/vgpu3", DeviceRef(MINOR, minor=1, vgpu=3)),
        ("nvidia0/gi0/vgpu0", DeviceRef(MINOR, minor=0, gpu_instance_id=0, vgpu=0)),
    ],
)
def test_parse_known_formats(device_id: str, expected: DeviceRef) -> None:
    assert parse_device_id(device_id) == expected


@pytest.mark.parametrize(
    "device_id",
    [
        "",
        "GPU-",
        "GPU-not-a-uuid",
        f"{GPU0}::",
        f"{GPU0}::x",
        f"{GPU0}:3",
        f"{GPU0} ",
        "MIG-GPU-5a5a7118/1/0",
        f"MIG-{GPU1}/3",
        "nvidia",
        "nvidia-0",
        "nvidia0/gi",
        "nvidia0/vgpu1/gi0",
        "/dev/nvidia0",
        "gpu-0",  # a DRA name is not a device-plugin id
        "0",
        "x" * 10000,
        "nvidia99999999999999999999999",
        "GPU-5A5A7118-E550-79A1-597E-7631E126C57A::99999999999999999999",
    ],
)
def test_unknown_formats_are_none_not_errors(device_id: str) -> None:
    assert parse_device_id(device_id) is None


def test_parse_rejects_non_strings() -> None:
    assert parse_device_id(None) is None  # type: ignore[arg-type]
    assert parse_dra_device(b"gpu-0") is None  # type: ignore[arg-type]


def test_shared_and_share() -> None:
    assert not parse_device_id(GPU0).shared
    assert parse_device_id(f"{GPU0}::0").shared
    assert parse_device_id(f"{GPU0}::0").share == 0
    assert parse_device_id("nvidia0/vgpu2").shared
    assert parse_device_id("nvidia0/vgpu2").share == 2
    assert not parse_device_id("nvidia0/gi1").shared


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpu-0", DeviceRef(DRA_GPU, minor=0, dra_index=0)),
        ("gpu-13", DeviceRef(DRA_GPU, minor=13, dra_index=13)),
        # earlier releases: profile id, placement start, placement size
        ("gpu-0-mig-9-4-4",
         DeviceRef(DRA_MIG, minor=0, dra_index=0, gi_profile_id=9, placement_start=4)),
        # current releases: profile, profile id, placement start
        (
            "gpu-1-mig-1g5gb-19-0",
            DeviceRef(DRA_MIG, minor=1, dra_index=1, mig_profile="1g5gb", gi_profile_id=19,
                      placement_start=0),
        ),
        (
            "gpu-1-mig-3g20gb-0-4",
            DeviceRef(DRA_MIG, minor=1, dra_index=1, mig_profile="3g20gb", gi_profile_id=0,
                      placement_start=4),
        ),
        (
            "gpu-0-mig-1g10gb-me-20-6",
            DeviceRef(DRA_MIG, minor=0, dra_index=0, mig_profile="1g10gb-me", gi_profile_id=20,
                      placement_start=6),
        ),
        ("gpu-2-mig-1g10gb", DeviceRef(DRA_MIG, minor=2, dra_index=2, mig_profile="1g10gb")),
    ],
)
def test_parse_dra(name: str, expected: DeviceRef) -> None:
    assert parse_dra_device(name) == expected


@pytest.mark.parametrize("name", ["gpu", "gpu-", "gpu-x", "gpu-vfio-0", GPU0, "nvidia0", "GPU-0"])
def test_parse_dra_unknown(name: str) -> None:
    assert parse_dra_device(name) is None


def test_resolve_uuid_and_minor_not_index(node_devices) -> None:
    r = DeviceResolver(node_devices)
    assert r.resolve(parse_device_id(GPU0)) == GPU0
    assert r.resolve(parse_device_id(f"{GPU2}::1")) == GPU2
    assert r.resolve(parse_device_id("GPU-" + GPU0[4:].upper())) == GPU0  # case-insensitive
    # GKE names GPUs by /dev/nvidiaN minor number: GPU0 has index 0 but minor 2.
    assert r.resolve(parse_device_id("nvidia2")) == GPU0
    assert r.resolve(parse_device_id("nvidia0")) == GPU1
    assert r.resolve(parse_device_id("nvidia1/vgpu4")) == GPU2
    assert r.resolve(parse_device_id("nvidia7")) is None
    unknown = "GPU-00000000-0000-0000-0000-000000000000"
    assert r.resolve(parse_device_id(unknown)) is None


def test_resolve_mig_forms(node_devices) -> None:
    r = DeviceResolver(node_devices)
    assert r.resolve(parse_device_id(MIG_B)) == MIG_B
    assert r.resolve(parse_device_id(f"{MIG_A}::2")) == MIG_A
    # Pre-R470: parent GPU uuid, GPU instance, compute instance.
    assert r.resolve(parse_device_id(f"MIG-{GPU1}/2/0")) == MIG_B
    assert r.resolve(parse_device_id(f"MIG-{GPU1}/3/0")) == MIG_C
    assert r.resolve(parse_device_id(f"MIG-{GPU1}/3/1")) is None
    assert r.resolve(parse_device_id(f"MIG-{GPU0}/1/0")) is None
    # GKE: nvidia<minor>/gi<G>; GPU1 has minor 0.
    assert r.resolve(parse_device_id("nvidia0/gi1")) == MIG_A
    assert r.resolve(parse_device_id("nvidia0/gi3/vgpu0")) == MIG_C
    assert r.resolve(parse_device_id("nvidia0/gi9")) is None
    assert r.resolve(parse_device_id("nvidia2/gi1")) is None  # GPU0 has no MIG instances


def test_resolve_gke_gi_with_several_compute_instances() -> None:
    g = gpu_device(GPU0, 0)
    ci0 = mig_device(MIG_A, g, gi=1, ci=0)
    ci1 = mig_device(MIG_B, g, gi=1, ci=1)
    r = DeviceResolver([g, ci1, ci0])
    assert r.resolve(parse_device_id("nvidia0/gi1")) == MIG_A
    assert r.resolve(parse_device_id(f"MIG-{GPU0}/1/1")) == MIG_B


def test_resolve_dra(node_devices) -> None:
    r = DeviceResolver(node_devices)
    # DRA gpu-N: N is the minor number (GPU2 has minor 1).
    assert r.resolve(parse_dra_device("gpu-1")) == GPU2
    assert r.resolve(parse_dra_device("gpu-2")) == GPU0
    assert r.resolve(parse_dra_device("gpu-5")) is None
    # MIG by profile on the GPU with minor 0 (GPU1): 3g.20gb is unique, 1g.5gb is not.
    assert r.resolve(parse_dra_device("gpu-0-mig-3g20gb-9-0")) == MIG_C
    assert r.resolve(parse_dra_device("gpu-0-mig-1g5gb-19-0")) is None
    assert r.resolve(parse_dra_device("gpu-0-mig-9-4-0")) is None  # three instances
    assert r.resolve(parse_dra_device("gpu-2-mig-1g5gb-19-0")) is None  # no MIG on GPU0


def test_resolve_dra_falls_back_to_index_without_minor_numbers() -> None:
    g0 = gpu_device(GPU0, 0)
    g1 = gpu_device(GPU1, 1)
    devices = [
        g0.__class__(**{**g0.__dict__, "minor_number": None}),
        g1.__class__(**{**g1.__dict__, "minor_number": None}),
    ]
    r = DeviceResolver(devices)
    assert r.resolve(parse_dra_device("gpu-1")) == GPU1
    # A GKE id still needs a real minor number.
    assert r.resolve(parse_device_id("nvidia1")) is None


def test_resolve_dra_mig_single_instance() -> None:
    g = gpu_device(GPU0, 0)
    only = mig_device(MIG_A, g, gi=5, profile="1g.10gb")
    r = DeviceResolver([g, only])
    assert r.resolve(parse_dra_device("gpu-0-mig-19-4-1")) == MIG_A
    assert r.resolve(parse_dra_device("gpu-0-mig-1g10gb-19-4")) == MIG_A
    assert r.resolve(parse_dra_device("gpu-0-mig-2g20gb-14-0")) is None


def test_resource_filter_defaults_and_extras() -> None:
    f = ResourceFilter()
    for name in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb",
                 "nvidia.com/mig-3g.20gb", "nvidia.com/mig-1g.10gb.me"):  # fmt: skip
        assert f.accepts_resource(name), name
    for name in ("nvidia.com/gpux", "amd.com/gpu", "cpu", "example.com/nic", "nvidia.com/a100"):
        assert not f.accepts_resource(name), name
    assert f.accepts_driver("gpu.nvidia.com")
    assert not f.accepts_driver("dra.example.com")

    g = ResourceFilter(["nvidia.com/a100", "acme.io/gpu-*"], ["compute-domain.nvidia.com"])
    assert g.accepts_resource("nvidia.com/a100")
    assert g.accepts_resource("acme.io/gpu-large")
    assert g.accepts_resource("nvidia.com/gpu")
    assert g.accepts_driver("compute-domain.nvidia.com")


# --- DRA MIG names resolved by GPU-instance profile id and placement ----------------------

SEVEN_1G = """
    devices:
      - name: NVIDIA H100 80GB HBM3
        memory: {total: 85520809984, used: 1048576}
        mig:
          - {profile: 1g.10gb, gpu_instance_id: 9}
          - {profile: 1g.10gb, gpu_instance_id: 10}
          - {profile: 1g.10gb, gpu_instance_id: 11}
          - {profile: 1g.10gb, gpu_instance_id: 12}
          - {profile: 1g.10gb, gpu_instance_id: 13}
          - {profile: 1g.10gb, gpu_instance_id: 14}
          - {profile: 1g.10gb, gpu_instance_id: 7}
"""


def _discovered(fake_nvml, spec: str) -> list:
    """The devices one real sampler pass discovers against the simulated driver."""
    from otel_gpu.sample.library import Nvml
    from otel_gpu.sample.sampler import Sampler
    from tests.support.nvml import SOURCES

    fake_nvml(spec)
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES)
    try:
        return [s.device for s in sampler.sample().devices]
    finally:
        sampler.close()
        nvml.shutdown()


def test_seven_1g10gb_instances_on_one_h100_each_resolve(fake_nvml) -> None:
    devices = _discovered(fake_nvml, SEVEN_1G)
    migs = [d for d in devices if d.is_mig]
    assert [(d.gpu_instance_profile_id, d.placement_start) for d in migs] == [
        (19, start) for start in range(7)]
    r = DeviceResolver(devices)
    resolved = [r.resolve(parse_dra_device(f"gpu-0-mig-1g10gb-19-{start}"))
                for start in range(7)]
    assert resolved == [d.uuid for d in migs]
    # the earlier releases' names (profile id, start, size) resolve the same way
    assert r.resolve(parse_dra_device("gpu-0-mig-19-3-1")) == migs[3].uuid
    assert r.resolve(parse_dra_device("gpu-0-mig-1g10gb-19-7")) is None  # no such placement
    assert r.resolve(parse_dra_device("gpu-0-mig-1g10gb")) is None  # no placement: ambiguous


def test_scenario_placement_and_profile_id_are_reported_as_given(fake_nvml) -> None:
    devices = _discovered(fake_nvml, """
        devices:
          - name: NVIDIA A100-SXM4-80GB
            memory: {total: 85899345920}
            mig:
              - {profile: 1g.20gb, gpu_instance_id: 3, gi_profile_id: 15, placement_start: 4}
              - {profile: 1g.10gb+me, gpu_instance_id: 5}
    """)
    migs = [d for d in devices if d.is_mig]
    assert [(d.gpu_instance_profile_id, d.placement_start) for d in migs] == [(15, 4), (20, 1)]
    r = DeviceResolver(devices)
    assert r.resolve(parse_dra_device("gpu-0-mig-1g20gb-15-4")) == migs[0].uuid
    assert r.resolve(parse_dra_device("gpu-0-mig-1g10gb-me-20-1")) == migs[1].uuid


def test_dra_mig_falls_back_to_the_profile_where_discovery_has_no_placement() -> None:
    from dataclasses import replace

    g = gpu_device(GPU0, 0)
    placed = replace(mig_device(MIG_A, g, gi=1, profile="1g.10gb"),
                     gpu_instance_profile_id=19, placement_start=0)
    unplaced = mig_device(MIG_B, g, gi=2, profile="2g.20gb")
    r = DeviceResolver([g, placed, unplaced])
    assert r.resolve(parse_dra_device("gpu-0-mig-1g10gb-19-0")) == MIG_A
    # 2g.20gb's placement is unknown: the profile decides, as with older drivers
    assert r.resolve(parse_dra_device("gpu-0-mig-2g20gb-14-2")) == MIG_B
    # a placement that no placed instance has does not fall back to a placed one
    assert r.resolve(parse_dra_device("gpu-0-mig-1g10gb-19-5")) is None
