"""The systemd unit: ``systemd-analyze verify`` and ``security`` accept it, hardened.

``verify`` checks that ExecStart's binary exists, so the test verifies a copy
whose ExecStart points at this checkout's ``otel-gpu``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otel_gpu.config import ENV_PREFIX, OPTIONS

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "otel-gpu.service"
ENV_FILE = ROOT / "deploy" / "systemd" / "otel-gpu.env"
INSTALLED = "/opt/otel-gpu/bin/otel-gpu"


def _settings(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of the unit, by key (a key may repeat)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture
def unit_copy(tmp_path) -> Path:
    binary = Path(sys.executable).parent / "otel-gpu"
    if not binary.is_file():
        pytest.skip(f"{binary} is not installed (pip install -e .)")
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED} serve" in text
    copy = tmp_path / "otel-gpu.service"
    copy.write_text(text.replace(INSTALLED, str(binary)))
    return copy


def _analyze(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not found (Debian package systemd)")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(unit_copy):
    done = _analyze("verify", "--man=no", str(unit_copy))
    said = [line for line in (done.stdout + done.stderr).splitlines()
            if "otel-gpu" in line]  # lines about other units on this host are not ours
    assert done.returncode == 0 and said == [], done.stdout + done.stderr


def test_systemd_rates_the_unit_well_hardened(unit_copy):
    done = _analyze("security", "--offline=true", "--no-pager", str(unit_copy))
    assert done.returncode == 0, done.stderr
    match = re.search(r"Overall exposure level for otel-gpu\.service: ([0-9.]+)", done.stdout)
    assert match, done.stdout[-2000:]
    assert float(match.group(1)) <= 2.5, done.stdout[-2000:]


def test_the_unit_has_the_hardening_and_device_access_it_promises():
    settings = _settings(UNIT.read_text())
    for key, value in {
        "DynamicUser": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
        "NoNewPrivileges": "yes", "PrivateTmp": "yes", "DevicePolicy": "closed",
        "CapabilityBoundingSet": "",
    }.items():
        assert settings.get(key) == [value], key
    assert "char-nvidia-frontend rw" in settings["DeviceAllow"]  # /dev/nvidiactl, /dev/nvidiaN
    assert "PrivateDevices" not in settings  # it would hide the GPUs
    assert settings["EnvironmentFile"] == ["-/etc/default/otel-gpu"]
    # ExitStatus 2 is a bad setting: restarting would repeat it
    assert settings["RestartPreventExitStatus"] == ["2"]


def test_the_environment_file_names_only_real_settings():
    known = {o.env for o in OPTIONS} | {ENV_PREFIX + "CONFIG"}
    names = re.findall(r"^#?((?:OTEL_GPU|OTEL)_[A-Z_]+)=", ENV_FILE.read_text(), re.M)
    assert names
    for name in names:
        if name.startswith(ENV_PREFIX):
            assert name in known, name
