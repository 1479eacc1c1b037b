"""The batched recogniser as several processes (``[recognizer] gpu_processes``,
subd.service.sharding), on the CPU with real tiny.en weights and real worker processes: channels
spread over the shards, each channel hears its own clip, and a shard killed mid-stream is
respawned while only its own channels wait (the other shard answers meanwhile)."""

from __future__ import annotations

import asyncio
import importlib.util
import time

import pytest
from batched_helpers import clip_files, read_wav

from subd.config import config_from_dict
from subd.errors import ConfigError
from subd.service.sharding import shard_count, torch_threads_per_shard
from subd.service.stages import RESTARTING, UP, StagePolicy

CLIPS = clip_files()


def test_auto_is_one_process_on_the_cpu_and_half_the_cores_on_cuda():
    assert shard_count("auto", cuda=False, cores=16) == 1
    assert shard_count("auto", cuda=True, cores=16) == 4  # capped (see AUTO_MAX_SHARDS)
    assert shard_count("auto", cuda=True, cores=6) == 3
    assert shard_count("auto", cuda=True, cores=2) == 1
    assert shard_count(3, cuda=False, cores=2) == 3  # asked for: as asked
    assert torch_threads_per_shard(8, cores=16) == 2
    assert torch_threads_per_shard(4, cores=2) == 1


@pytest.mark.parametrize("value", [0, 65, "4", "many", True, 2.5])
def test_a_bad_gpu_processes_is_a_one_line_error(value):
    with pytest.raises(ConfigError, match=r"gpu_processes"):
        config_from_dict({"recognizer": {"gpu_processes": value}})


def test_gpu_processes_takes_auto_or_a_number():
    assert config_from_dict({}).recognizer.gpu_processes == "auto"
    assert config_from_dict({"recognizer": {"gpu_processes": 4}}).recognizer.gpu_processes == 4


def test_max_rows_caps_each_shards_batches_as_well_as_its_rows():
    """``subd bench gpu --max-rows N``: a shard's worker puts at most N requests in a batch
    (it took 256 and the host ran larger batches in parts). Nothing is started here."""
    from subd.service.batching import BATCH_ROWS
    from subd.service.sharding import batched_recogniser

    cfg = config_from_dict({"recognizer": {"batched": "on", "device": "cpu",
                                           "gpu_processes": 2}}).recognizer
    capped = batched_recogniser(cfg, cuda=False, max_rows=24)
    assert [s.scheduler.max_rows for s in capped.shards] == [24, 24]
    assert [s.worker._spec.kwargs["max_rows"] for s in capped.shards] == [24, 24]
    default = batched_recogniser(cfg, cuda=False)
    assert [s.scheduler.max_rows for s in default.shards] == [BATCH_ROWS, BATCH_ROWS]


@pytest.mark.parametrize("value", [0, 4097, "64", "all", True, 8.5])
def test_a_bad_gpu_max_rows_is_a_one_line_error(value):
    with pytest.raises(ConfigError, match=r"gpu_max_rows") as err:
        config_from_dict({"recognizer": {"gpu_max_rows": value}})
    assert "\n" not in str(err.value)


def test_gpu_max_rows_caps_the_daemons_batched_processes_and_their_batches():
    """``[recognizer] gpu_max_rows = N``: each batched process takes at most N rows and its
    worker puts at most N requests in a batch, one process or several; "auto" leaves the rows
    to the process's share of the GPU (rows_that_fit). Nothing is started here."""
    from subd.service.batching import BATCH_ROWS
    from subd.service.daemon import Daemon
    from subd.service.sharding import batched_recogniser

    def recognizer(**keys):
        return config_from_dict({"recognizer": {"batched": "on", "device": "cpu", **keys}})

    cfg = recognizer(gpu_processes=2, gpu_max_rows=48).recognizer
    shards = batched_recogniser(cfg, cuda=False).shards
    assert [s.scheduler.max_rows for s in shards] == [48, 48]
    assert [s.worker._spec.kwargs["max_rows"] for s in shards] == [48, 48]
    shards = batched_recogniser(recognizer(gpu_processes=2).recognizer, cuda=False).shards
    assert [s.scheduler.max_rows for s in shards] == [BATCH_ROWS, BATCH_ROWS]
    assert ["max_rows" not in s.worker._spec.kwargs for s in shards] == [True, True]
    # one process: the daemon's own worker spec
    one = Daemon(config=recognizer(gpu_max_rows=48))._recogniser_worker()
    assert one._spec.kwargs["max_rows"] == 48
    assert "max_rows" not in Daemon(config=recognizer())._recogniser_worker()._spec.kwargs


def _host(history, model: str = "tiny.en"):
    from subd.service.build import recognizer_spec
    from subd.workers.hosts import FactorySpec

    return FactorySpec("subd.workers.hosts:RecogniserHost", {
        "recognizer": recognizer_spec(model, ""), "history_capacity": history.capacity,
        "history_name": history.shm_name})


async def _words(cw, history, audio, end: int) -> list[str]:
    from subd.workers.hosts import UpdateRequest

    history.write(history.end_sample, audio[history.end_sample:end])
    result = await cw.call(UpdateRequest(end), time.monotonic_ns())
    return [w.text for w in result.hypothesis.committed + result.hypothesis.tentative]


@pytest.mark.skipif(len(CLIPS) < 3 or importlib.util.find_spec("subd.recognise.streaming")
                    is None, reason="needs the LibriVox clips and the streaming recogniser")
@pytest.mark.parametrize("kind", ["batched", "serial"])
def test_channels_spread_over_shards_and_a_dead_shard_stalls_only_its_own(kind):
    """Batched shards (gpu_processes) and serial ones on the CPU (cpu_processes) alike."""
    import numpy as np

    from subd.history import AudioHistory
    from subd.service.sharding import batched_recogniser, serial_recogniser

    # two different 25 s streams (the clips in turn, forwards and backwards), two channels each
    streams = [np.concatenate([read_wav(c) for c in CLIPS]),
               np.concatenate([read_wav(c) for c in CLIPS[::-1]])]
    audios = [streams[i % 2] for i in range(4)]
    cfg = config_from_dict({"recognizer": {"batched": "on" if kind == "batched" else "off",
                                           "device": "cpu", "gpu_processes": 2,
                                           "cpu_processes": 2}}).recognizer

    async def scenario() -> None:
        policy = StagePolicy(start_timeout_s=600)
        rec = batched_recogniser(cfg, cuda=False, policy=policy) if kind == "batched" else \
            serial_recogniser(cfg, len(audios), policy=policy)
        histories = [AudioHistory(40 * 16_000, shared=True) for _ in audios]
        try:
            await rec.start(600)
            assert [s.name for s in rec.shards] == ["recognise.0", "recognise.1"]
            workers = [await rec.attach(f"c{i}", _host(h)) for i, h in enumerate(histories)]
            # least loaded first: the four channels alternate, two on each shard
            assert [rec.shard_of(f"c{i}") for i in range(4)] == [0, 1, 0, 1]
            assert rec.loads() == [2, 2]
            first = await asyncio.gather(*(_words(cw, h, a, 5 * 16_000) for cw, h, a in
                                           zip(workers, histories, audios, strict=True)))
            assert all(first), first  # every channel heard its own clip's speech
            assert first[0] == first[2] and first[1] == first[3]  # same clip, same words
            assert first[0] != first[1]

            dead, alive = rec.shards
            # the dead shard's respawn waits 10 s: what the other shard answers meanwhile is
            # answered without it, however fast this machine reloads a model
            dead.policy = StagePolicy(first_backoff_ns=10_000_000_000, start_timeout_s=600)
            pid = dead.worker.pid
            dead.worker.kill()  # SIGKILL between requests: seen at once, respawn starts
            for _ in range(200):
                if dead.state == RESTARTING:
                    break
                await asyncio.sleep(0.01)
            assert dead.state == RESTARTING
            # the other shard's channels are answered while the dead one reloads its model
            others = await asyncio.gather(*(_words(workers[i], histories[i], audios[i],
                                                   8 * 16_000) for i in (1, 3)))
            assert all(others), others
            assert dead.state == RESTARTING and alive.state == UP
            assert alive.restarts == 0 and alive.generation == 0
            # the dead shard's channels wait through the respawn, then resume where they were
            again = await asyncio.gather(*(_words(workers[i], histories[i], audios[i],
                                                  8 * 16_000) for i in (0, 2)))
            assert dead.restarts == 1 and dead.state == UP
            # (a respawned recogniser starts afresh at the audio it had reached: it hears the
            # next seconds' words)
            again = await asyncio.gather(*(_words(workers[i], histories[i], audios[i],
                                                  12 * 16_000) for i in (0, 2)))
            assert all(again), again
            assert dead.restarts == 1 and dead.worker.pid != pid and dead.state == UP
            assert rec.restarts == 1

            # a channel that leaves frees its place: the next one goes to that shard
            await rec.detach("c1")
            assert rec.loads() == [2, 1]
            history = AudioHistory(40 * 16_000, shared=True)
            histories.append(history)
            cw = await rec.attach("c4", _host(history))
            assert rec.shard_of("c4") == 1 and rec.loads() == [2, 2]
            assert await _words(cw, history, audios[1], 5 * 16_000) == first[1]
        finally:
            await rec.close(5.0)
            for h in histories:
                h.close()

    asyncio.run(scenario())


@pytest.mark.skipif(len(CLIPS) < 3 or importlib.util.find_spec("subd.recognise.streaming")
                    is None, reason="needs the LibriVox clips and the streaming recogniser")
def test_subd_run_shares_its_channels_out_over_gpu_processes(tmp_path):
    """``subd run`` with gpu_processes = 2 (batched on the CPU): two recogniser processes, one
    channel each, and each channel its own clip's words."""
    import re

    from daemon_helpers import assert_each_channel_reads_its_clip, start_file_channels, wait_for

    clips = [c for c in CLIPS if c.name.endswith(("0870.wav", "0920.wav"))]
    daemon = start_file_channels(tmp_path, clips, 'batched = "on"\ngpu_processes = 2')
    try:
        wait_for(lambda: daemon.log_text().count("published") >= 2, 300,
                 "both channels to finish", daemon.proc, daemon.log)
    finally:
        daemon.stop()
    log = daemon.log_text()
    assert "recognise: 2 batched processes share the channels" in log
    # one channel on each process: each answered its own channel's requests
    served = dict(re.findall(r"(recognise\.\d): (\d+) requests in \d+ batches", log))
    assert set(served) == {"recognise.0", "recognise.1"}, log[-2000:]
    assert all(int(n) > 0 for n in served.values())
    assert_each_channel_reads_its_clip(clips, tmp_path)
