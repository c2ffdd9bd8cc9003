"""Loading scenarios: defaults, generated identity, and one-line errors naming the key."""

from __future__ import annotations

import os
import uuid

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_gpu.errors import SetupError
from otel_gpu.sim import ScenarioError, load_scenario
from otel_gpu.sim.scenario._checks import uuid5
from tests.sim.helpers import handles, next_sample, write


def test_generated_identity_is_deterministic():
    first, second = load_scenario("h100x8"), load_scenario("h100x8")
    assert [d.uuid for d in first.devices] == [d.uuid for d in second.devices]
    assert first.name == "h100x8" and first.driver_version == "550.90.07"


GPU = "devices:\n  - name: NVIDIA L4\n"

@pytest.mark.parametrize(("text", "message"), [
    (GPU + "    memory: {total: x}\n",
     "devices[0].memory.total: expected a non-negative integer, got 'x'"),
    ("colour: blue\n" + GPU, "colour: unknown key (allowed: "),
    (GPU + "    colour: blue\n", "devices[0].colour: unknown key"),
    (GPU + "    memory: {total: 1, free: 2}\n", "devices[0].memory.free: unknown key"),
    (GPU + "    uuid: GPU-a\n  - name: NVIDIA L4\n    uuid: GPU-a\n",
     "devices[1].uuid: duplicate uuid 'GPU-a' (also used by devices[0].uuid)"),
    (GPU + "    uuid: MIG-a\n", "devices[0].uuid: expected a UUID starting with 'GPU-'"),
    (GPU + "    errors: {nvmlDeviceGetPowerUsage: BOGUS}\n",
     "devices[0].errors.nvmlDeviceGetPowerUsage: unknown NVML error 'BOGUS'"),
    (GPU + "    fields: {NOT_A_FIELD: 1}\n", "devices[0].fields.NOT_A_FIELD: unknown NVML field"),
    (GPU + "    unsupported: [nvmlDeviceGetBogus]\n",
     "devices[0].unsupported[0]: unknown NVML function or field 'nvmlDeviceGetBogus'"),
    (GPU + "    unsupported: [nvmlDeviceGetFanSpeed]\n    no_permission: [nvmlDeviceGetFanSpeed]\n",
     "devices[0].no_permission[0]: 'nvmlDeviceGetFanSpeed' is also listed at "
     "devices[0].unsupported[0]"),
    (GPU + "    count: 2\n    uuid: GPU-a\n", "devices[0].uuid: not allowed with count > 1"),
    (GPU + "    temperature: hot\n", "devices[0].temperature: expected a number"),
    (GPU + "    power: {step: 5}\n", "devices[0].power: missing required key 'start'"),
    (GPU + "    power: {start: 1, slope: 5}\n", "devices[0].power.slope: unknown key"),
    (GPU + "    utilization: {gpu: [1, x]}\n",
     "devices[0].utilization.gpu[1]: expected a non-negative number, got 'x'"),
    (GPU + "    mig: [{profile: 1g.5gb, gpu_instance_id: -1}]\n",
     "devices[0].mig[0].gpu_instance_id: expected a non-negative integer, got -1"),
    (GPU + "    mig: [{profile: 1g.5gb, gpu_instance_id: 1},\n"
           "          {profile: 1g.5gb, gpu_instance_id: 1}]\n",
     "devices[0].mig[1]: duplicate (gpu_instance_id, compute_instance_id) (1, 0)"),
    (GPU + "    mig: [{profile: 1g.5gb, gpu_instance_id: 1, unsupported: [MEMORY_TEMP]}]\n",
     "devices[0].mig[0].unsupported[0]: unknown NVML function 'MEMORY_TEMP'"),
    (GPU + "    mig_capable: false\n    mig: [{profile: 1g.5gb, gpu_instance_id: 1}]\n",
     "devices[0].mig: MIG instances on a GPU with mig_capable: false"),
    (GPU + "    pci_bus_id: 00000000:18:00.0\n",
     "devices[0].pci_bus_id: expected a PCI bus id like '00000000:18:00.0' (quote it in YAML)"),
    (GPU + "    pci_bus_id: '0000:18:00.0'\n"
           "  - name: NVIDIA L4\n    pci_bus_id: '00000000:18:00.0'\n",
     "devices[1].pci_bus_id: duplicate PCI bus id '00000000:18:00.0'"),
    (GPU + "    slow: [{function: nvmlDeviceGetBogus, seconds: 1}]\n",
     "devices[0].slow[0].function: unknown NVML device function 'nvmlDeviceGetBogus'"),
    (GPU + "    xid: [{sample: 2}]\n", "devices[0].xid[0]: missing required key 'code'"),
    (GPU + "    processes: [{pid: 0}]\n",
     "devices[0].processes[0].pid: expected an integer from 1"),
    (GPU + "    processes: [{pid: 5, positions: [1]}]\n",
     "devices[0].processes[0].positions[0]: expected an integer from 0 to 0, got 1"),
    (GPU + "    temperature: 1\n    temperature: 2\n",
     "invalid YAML: duplicate key 'temperature' at line 4, column 5"),
    ("devices: [\n", "invalid YAML: expected the node content, but found '<stream end>' at "
                     "line 2, column 1"),
    ("- 1\n", "top level: expected a mapping, got [1]"),
    ("name: x\n", "top level: missing required key 'devices'"),
    ("errors: {nvmlDeviceGetPowerUsage: UNKNOWN}\ndevices: []\n",
     "errors.nvmlDeviceGetPowerUsage: unknown NVML function 'nvmlDeviceGetPowerUsage'"),
    ("driver_version: 550.90\ndevices: []\n",
     "driver_version: expected a non-empty string (quote it in YAML), got 550.9"),
])
def test_scenario_errors_are_one_line_with_the_key_path(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"scenario {path}: ")
    assert message in text


def test_a_scenario_error_is_caught_as_a_setup_error_in_one_line(tmp_path):
    """The CLI catches setup errors and prints their one line: a bad scenario is one."""
    path = write(tmp_path, "devices: 7\n")
    with pytest.raises(SetupError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"scenario {path}: ") and "\n" not in str(info.value)


def test_missing_scenario_names_the_path_and_the_builtins(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ScenarioError) as info:
        load_scenario(missing)
    text = str(info.value)
    assert "\n" not in text
    assert missing in text
    assert "a100-mig, demo, gb200, h100x8, h200, t4" in text


def test_builtin_errors_name_the_profile_file(monkeypatch, tmp_path):
    (tmp_path / "broken.yaml").write_text(GPU + "    memory: {total: x}\n")
    monkeypatch.setattr("otel_gpu.sim.scenario.parse.PROFILES_DIR", tmp_path)
    with pytest.raises(ScenarioError, match=r"^scenario broken\.yaml: devices\[0\]\.memory"):
        load_scenario("broken")


def test_scenario_name_defaults_to_file_stem(tmp_path):
    assert load_scenario(write(tmp_path, GPU, "my-rig.yaml")).name == "my-rig"
    assert load_scenario(write(tmp_path, "name: other\n" + GPU, "x.yaml")).name == "other"


def test_count_expands_with_per_device_values(nvml, tmp_path):
    path = write(tmp_path, """
devices:
  - name: NVIDIA L4
    count: 3
    temperature: {start: 40, per_device: 1, step: 2}
    mig_capable: true
    mig: [{profile: 1g.6gb, gpu_instance_id: 3}]
  - name: NVIDIA L40S
    temperature: 70
""", "rig.yaml")
    scenario = load_scenario(path)
    assert [d.index for d in scenario.devices] == [0, 1, 2, 3]
    assert [d.position for d in scenario.devices] == [0, 1, 2, 0]
    mig_uuids = {d.mig[0].uuid for d in scenario.devices[:3]}
    assert len(mig_uuids) == 3
    nvml(scenario)
    temps = []
    for _ in range(2):
        next_sample()
        temps.append([pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                      for h in handles()])
    assert temps == [[40, 41, 42, 70], [42, 43, 44, 70]]


@pytest.mark.parametrize(("text", "message"), [
    (GPU + "    count: 100000000\n",
     "devices[0].count: at most 512 GPUs in a scenario (0 before this entry, 100000000 in it)"),
    (GPU + "    count: 510\n  - name: NVIDIA L4\n    count: 5\n",
     "devices[1].count: at most 512 GPUs in a scenario (510 before this entry, 5 in it)"),
    (GPU + "    count: 512\n  - name: NVIDIA L4\n", "devices[1]: at most 512 GPUs in a scenario"),
    (GPU + "    power: .inf\n", "devices[0].power: expected a finite number no larger than "
                                "2^64-1 in size, got inf"),
    (GPU + "    power: .nan\n", "devices[0].power: expected a finite number"),
    (GPU + "    temperature: {start: 1, step: -.inf}\n",
     "devices[0].temperature.step: expected a finite number"),
    (GPU + "    utilization: {gpu: [1, .nan]}\n", "devices[0].utilization.gpu[1]: expected a "
                                                  "finite number"),
    (GPU + "    fields: {TOTAL_ENERGY_CONSUMPTION: {start: 1.0e+30}}\n",
     "TOTAL_ENERGY_CONSUMPTION.start: expected a finite number no larger than 2^64-1"),
    (GPU + "    memory: {total: 100000000000000000000000}\n",
     "devices[0].memory.total: expected an integer no larger than 18446744073709551615"),
    (GPU + "    slow: [{function: nvmlDeviceGetPowerUsage, seconds: .inf}]\n",
     "devices[0].slow[0].seconds: expected a finite number no larger than 3600 in size"),
    (GPU + "    slow: [{function: nvmlDeviceGetPowerUsage, seconds: 4000}]\n",
     "devices[0].slow[0].seconds: expected a finite number no larger than 3600"),
    ("devices:\n  - &g {name: NVIDIA L4}\n  - *g\n",
     "invalid YAML: YAML aliases (*g) are not allowed at line 3"),
    ("devices:\n  - name: !!int x\n", "invalid value (invalid literal for int()"),
    ("devices: " + "[" * 100 + "]" * 100 + "\n", "invalid YAML: nested deeper than 32 levels"),
])
def test_counts_are_capped_and_numbers_finite(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"scenario {path}: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_sixty_four_gpus_load(tmp_path):
    scenario = load_scenario(write(tmp_path, GPU + "    count: 63\n  - name: NVIDIA L4\n"))
    assert len(scenario.devices) == 64


def test_scenario_files_are_read_safely(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(GPU.encode() + b"    serial: caf\xe9\n")
    with pytest.raises(ScenarioError, match=r"^scenario .*s\.yaml: not UTF-8 text"):
        load_scenario(str(path))
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ScenarioError, match=r"^scenario .*fifo\.yaml: not a regular file \(a "
                                            r"FIFO\)"):
        load_scenario(str(fifo))
    with pytest.raises(ScenarioError, match=r"^scenario /dev/zero: not a regular file"):
        load_scenario("/dev/zero")
    with pytest.raises(ScenarioError, match=r"no such file or built-in profile"):
        load_scenario("a\x00b")


@given(st.text(max_size=64), st.uuids())
def test_the_scenarios_uuid5_is_the_standard_librarys(name, namespace):
    assert uuid5(name, namespace) == uuid.uuid5(namespace, name)
