"""[recognizer] device/precision and --device: validated at load; CUDA asked for where there
is none is one line on stderr and exit code 2 (the daemon does not start on the CPU instead)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from subd.config import RecognizerConfig, build_section, nvidia_present
from subd.errors import ConfigError
from subd.gpu.device import resolve_device, resolve_precision

NO_CUDA = not torch.cuda.is_available()


def _rec(**table):
    return build_section("recognizer", RecognizerConfig, table)


def test_defaults_are_auto():
    rec = _rec()
    assert (rec.device, rec.precision, rec.batched) == ("auto", "auto", "auto")


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "CUDA", "cpu:0", ""])
def test_malformed_device_names_the_key_and_the_choices(bad):
    with pytest.raises(ConfigError) as err:
        _rec(device=bad)
    assert "[recognizer] device" in str(err.value) and "cuda:N" in str(err.value)


def test_precision_must_fit_the_device():
    with pytest.raises(ConfigError, match="int8 runs on the CPU only"):
        _rec(device="cuda:0", precision="int8") if nvidia_present() else \
            resolve_precision("int8", "cuda:0")
    with pytest.raises(ConfigError, match="fp16 needs CUDA"):
        _rec(device="cpu", precision="fp16")
    with pytest.raises(ConfigError, match="bf16 needs CUDA"):
        _rec(batched="off", precision="bf16")  # the serial recogniser: the CPU
    if not nvidia_present():  # device "auto" is the CPU here
        with pytest.raises(ConfigError, match="fp16 needs CUDA"):
            _rec(precision="fp16")
    assert resolve_precision("auto", "cpu") == "int8"
    assert resolve_precision("auto", "cuda:0") == "fp16"


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
def test_auto_is_the_cpu_without_cuda_and_cuda_is_refused():
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ConfigError) as err:
        resolve_device("cuda:1")
    assert "CUDA is not available" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(nvidia_present(), reason="this machine has an NVIDIA driver")
def test_config_file_asking_for_cuda_is_refused_at_load(tmp_path):
    from subd.config import load_config

    path = tmp_path / "subd.toml"
    path.write_text('[recognizer]\ndevice = "cuda"\n')
    with pytest.raises(ConfigError, match="CUDA is not available"):
        load_config(str(path))


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
@pytest.mark.parametrize("command", [
    ["stream", "{wav}", "--device", "cuda"],
    ["transcribe", "{wav}", "-o", "{out}", "--device", "cuda:0"],
])
def test_cli_asking_for_cuda_exits_2_with_one_line(tmp_path, speech_clips, command):
    args = [a.format(wav=speech_clips[0].path, out=tmp_path / "out.srt") for a in command]
    done = subprocess.run([sys.executable, "-m", "subd.cli", *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDA is not available" in lines[0] and "--device" in lines[0]
    assert not (tmp_path / "out.srt").exists()
