"""The GPU drop-in (systemd/gpu/gpu.conf) loads cleanly onto both units and opens exactly the
NVIDIA devices, keeping the units' closed device policy."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parent.parent / "systemd"
DROP_IN = SYSTEMD / "gpu" / "gpu.conf"


def _settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_drop_in_opens_the_nvidia_devices_only():
    s = _settings(DROP_IN.read_text())
    assert s["DeviceAllow"] == ["char-nvidia-frontend rw", "char-nvidia-uvm rw",
                                "char-nvidia-caps r"]
    assert "DevicePolicy" not in s and "PrivateDevices" not in s  # the unit's policy stays
    assert any("CUDA_CACHE_PATH=%C/subd/cuda" in e for e in s["Environment"])
    for unit in ("subd.service", "subd@.service"):
        text = (SYSTEMD / unit).read_text()
        assert "DevicePolicy=closed" in text and "systemd/gpu/gpu.conf" in text


@pytest.mark.parametrize("name", ["subd.service", "subd@.service"])
def test_units_with_the_drop_in_verify_without_warnings(tmp_path, name):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    unit = tmp_path / (name.replace("@", "@studio1") if "@" in name else name)
    unit.write_text((SYSTEMD / name).read_text())
    drop = tmp_path / f"{unit.name}.d"
    drop.mkdir()
    (drop / "gpu.conf").write_text(DROP_IN.read_text())
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"}  # so that the drop-in is read
    probe = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                           capture_output=True, text=True, timeout=60, env=env)
    if probe.returncode != 0 and "Failed to" in probe.stderr and "gpu.conf" not in probe.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {probe.stderr.strip()[:200]}")
    assert probe.returncode == 0 and probe.stderr.strip() == "", probe.stderr
    # the drop-in was read: a key it does not know would be reported
    (drop / "gpu.conf").write_text(DROP_IN.read_text() + "NotAKey=1\n")
    again = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                           capture_output=True, text=True, timeout=60, env=env)
    assert "NotAKey" in again.stderr
