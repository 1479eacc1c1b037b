"""The recogniser's update cadence: min_update_ms on the CPU (unchanged), gpu_update_ms on a
GPU, "auto" there derived from the latency budget D (subd.pipeline.cadence)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

import subd.config as config_module
from subd.bench.quality import cadence_ms
from subd.config import RecognizerConfig, config_from_dict, load_config
from subd.errors import ConfigError, UserError
from subd.pipeline.cadence import (
    CADENCE_STEP_MS,
    GPU_UPDATE_MAX_MS,
    GPU_UPDATE_MIN_MS,
    auto_gpu_update_ms,
    update_cadence_ms,
)
from subd.pipeline.deadline import FULL_SPAN_CONTEXT_NS, UPDATE_MARGIN_NS

MS = 1_000_000


def right_context_ms(latency_ms: int, lookahead_ms: int, cadence: int, cost: int) -> float:
    """What the planner leaves the words due before the next result (subd.pipeline.deadline:
    budget - max(cost, gap) - cost), in ms."""
    budget = latency_ms - lookahead_ms - UPDATE_MARGIN_NS / MS
    return budget - max(cost, cadence) - cost


def test_auto_on_a_gpu_is_slower_at_a_longer_latency_and_never_below_the_cpu_cadence():
    assert auto_gpu_update_ms(2000, 150) == 520
    assert auto_gpu_update_ms(1000, 150) == 200  # no slower cadence leaves 0.75 s there
    assert auto_gpu_update_ms(500, 150) == 200
    assert auto_gpu_update_ms(4000, 150) == GPU_UPDATE_MAX_MS == 1000
    assert auto_gpu_update_ms(10_000, 150) == 1000
    values = [auto_gpu_update_ms(d, 150) for d in range(300, 10_001, 10)]
    assert values == sorted(values)
    assert all(v % CADENCE_STEP_MS == 0 for v in values)


@pytest.mark.parametrize("latency_ms", [1600, 2000, 2400, 2777, 3000])
@pytest.mark.parametrize("lookahead_ms", [40, 150])
def test_auto_is_the_slowest_cadence_that_leaves_the_full_inputs_right_context(latency_ms,
                                                                                 lookahead_ms):
    """An update that takes as long as the cadence (a loaded GPU) still leaves the due words
    0.75 s of right context; one step slower would not (unless clamped at 1 s)."""
    c = auto_gpu_update_ms(latency_ms, lookahead_ms)
    need = FULL_SPAN_CONTEXT_NS / MS
    if GPU_UPDATE_MIN_MS < c:
        assert right_context_ms(latency_ms, lookahead_ms, c, c) >= need
    if GPU_UPDATE_MIN_MS < c < GPU_UPDATE_MAX_MS:
        slower = c + CADENCE_STEP_MS
        assert right_context_ms(latency_ms, lookahead_ms, slower, slower) < need


def test_the_cpu_keeps_min_update_ms_at_every_latency():
    rec = RecognizerConfig()
    assert rec.min_update_ms == 200 and rec.gpu_update_ms == "auto"
    for d in (500, 1000, 2000, 4000, 10_000):
        assert update_cadence_ms(rec, d, 150, gpu=False) == 200
    assert update_cadence_ms(RecognizerConfig(min_update_ms=350), 2000, 150, gpu=False) == 350


def test_a_gpu_takes_gpu_update_ms_auto_from_d_or_as_set():
    assert update_cadence_ms(RecognizerConfig(), 2000, 150, gpu=True) == 520
    assert update_cadence_ms(RecognizerConfig(), 1000, 150, gpu=True) == 200
    assert update_cadence_ms(RecognizerConfig(min_update_ms=350), 4000, 150, gpu=True) == 1000
    assert update_cadence_ms(RecognizerConfig(gpu_update_ms=300), 2000, 150, gpu=True) == 300


@pytest.mark.parametrize("key,good,bads", [
    ("gpu_update_ms", 400, ("fast", -1, 10_001, True, 2.5)),
    ("update_cost_ms", 500, ("fixed", 0, 19, 10_001, True, 2.5)),
])
def test_cadence_keys_are_validated_at_load(tmp_path, key, good, bads):
    assert getattr(config_from_dict({"recognizer": {key: good}}).recognizer, key) == good
    for bad in bads:
        with pytest.raises(ConfigError, match=key):
            config_from_dict({"recognizer": {key: bad}})
    path = tmp_path / "c.toml"
    path.write_text(f'[recognizer]\n{key} = "slow"\n')
    out = subprocess.run([sys.executable, "-m", "subd.cli", "run", "--config", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert key in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_planned_cost_reaches_the_pipeline_as_ms_and_measured_as_0():
    assert RecognizerConfig().planned_cost_ms() == 0
    assert RecognizerConfig(update_cost_ms=500).planned_cost_ms() == 500


def test_the_shipped_config_documents_and_sets_auto():
    cfg = load_config("config.toml")
    assert cfg.recognizer.gpu_update_ms == "auto" and cfg.recognizer.min_update_ms == 200
    assert cfg.recognizer.update_cost_ms == "measured"


def test_only_the_batched_recogniser_on_a_gpu_takes_the_gpu_cadence(monkeypatch):
    assert not RecognizerConfig(device="cpu").on_gpu()
    monkeypatch.setattr(config_module, "nvidia_present", lambda: False)
    assert not RecognizerConfig().on_gpu()  # device auto, no driver: the CPU
    monkeypatch.setattr(config_module, "nvidia_present", lambda: True)
    assert RecognizerConfig().on_gpu()
    assert RecognizerConfig(device="cuda:1").on_gpu()
    assert not RecognizerConfig(device="cpu").on_gpu()
    assert not RecognizerConfig(batched="off").on_gpu()
    assert not RecognizerConfig(factory="mod:make").on_gpu()


def test_bench_quality_runs_at_the_gpus_cadence_when_asked():
    def args(v):
        return SimpleNamespace(min_update_ms=v)

    assert cadence_ms(args("gpu"), 2000, 150) == 520
    assert cadence_ms(args("gpu"), 1000, 150) == 200
    assert cadence_ms(args("600"), 2000, 150) == 600
    for bad in ("x", "5", "20000"):
        with pytest.raises(UserError, match="--min-update-ms"):
            cadence_ms(args(bad), 2000, 150)
