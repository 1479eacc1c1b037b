"""A wrong, missing or truncated weight file is a one-line error naming the file."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from subd.errors import ModelError
from subd.models.loading import PACKAGED, _package_dir, load_model, verify_file

TINY = PACKAGED["tiny.en"]


def _pinned(pin):
    return _package_dir(pin.package, TINY.pip_name) / pin.relpath


def test_verify_accepts_the_packaged_weights():
    pin = TINY.weights[0]
    verify_file(_pinned(pin), pin.sha256, pin.n_bytes)


def test_truncated_copy_is_reported_with_sizes(tmp_path):
    pin = TINY.weights[0]
    cut = tmp_path / "model.bin"
    cut.write_bytes(_pinned(pin).read_bytes()[:1000])
    with pytest.raises(ModelError) as err:
        verify_file(cut, pin.sha256, pin.n_bytes)
    msg = str(err.value)
    assert "truncated" in msg and str(cut) in msg and str(pin.n_bytes) in msg and "\n" not in msg


def test_changed_bytes_fail_the_checksum(tmp_path):
    pin = TINY.weights[0]
    data = bytearray(_pinned(pin).read_bytes())
    data[5000] ^= 0xFF
    bad = tmp_path / "model.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="sha256"):
        verify_file(bad, pin.sha256, pin.n_bytes)


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="missing"):
        verify_file(tmp_path / "nope.bin", "0" * 64, 10)


@pytest.fixture()
def model_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    for pin in (TINY.config, TINY.tokenizer):
        shutil.copy(_pinned(pin), d / pin.relpath.split("/")[-1])
    return d


def test_truncated_model_dir_is_one_line(model_dir):
    (model_dir / "model.bin").write_bytes(_pinned(TINY.weights[0]).read_bytes()[:50_000])
    with pytest.raises(ModelError, match="truncated"):
        load_model(str(model_dir))


def test_garbage_model_bin(model_dir):
    (model_dir / "model.bin").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelError, match="not a CTranslate2"):
        load_model(str(model_dir))


def test_dir_without_tokenizer(model_dir):
    (model_dir / "model.bin").write_bytes(b"\x00" * 64)
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match="tokenizer.json"):
        load_model(str(model_dir))


def test_cli_bad_model_path_exits_2_with_one_line(tmp_path, speech_clips):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.bin").write_bytes(b"junk")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "subd.cli",
            "transcribe",
            str(speech_clips[0].path),
            "-o",
            str(tmp_path / "o.srt"),
            "--model",
            str(tmp_path / "m"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "config.json: missing" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_compact_copy_loads_from_its_path_and_recognises(model_dir, speech_clips):
    """subd's compact int8-rounded copy (models.portable, what fits on a machine the wheel
    cannot reach) is a model path like any other: the CPU engine loads it and transcribes."""
    from subd.models.engine import WhisperEngine
    from subd.models.portable import load_weights, save_portable
    from subd.sources.decode import load_audio
    from tests.conftest import normalise, word_errors

    copy = save_portable(load_model("tiny.en"), model_dir / "compact", model_dir / "tokenizer.json")
    engine = WhisperEngine.load(str(copy), quantize=True)
    clip = speech_clips[0]
    words = engine.transcribe_window(load_audio(clip.path)).words
    text = " ".join(w.text for w in words)
    ref = normalise(clip.transcript)
    assert word_errors(ref, normalise(text)) <= 0.2 * len(ref), text
    (copy / "weights_int8.pt").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelError, match="not a portable model"):
        load_weights(str(copy))
