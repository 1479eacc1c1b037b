"""The recogniser as several processes ("shards") on one device: batched (``[recognizer]
gpu_processes``), or serial on the CPU (``cpu_processes``).

One batched recogniser process serves every channel's decodes in one batch, but the Python work
per window (each channel's policy, VAD, word grouping, the batch's bookkeeping) runs under that
process's ONE interpreter lock: on an H200 one process kept the GPU a quarter busy (128 tiny.en
channels; py-spy ``--gil``: the lock, not the GPU, set the batch time). Several processes, each
with its own lock, CUDA context, batched engine and batching queue
(:class:`~subd.service.batching.BatchingSharedWorker`), keep the GPU busier.

:class:`ShardedRecogniser` is what channels see as the recogniser stage: ``attach`` gives a new
channel to the shard with the fewest channels (the lowest index on a tie), ``detach`` takes it
from its own shard. Each shard is a stage of its own, supervised as ever: a shard that dies or
hangs is respawned and its channels re-attached and resumed, while the other shards' channels
keep their answers coming (their requests, attaches and detaches go to their own shard's queue
and lock only). A channel stays on its shard for its life; a channel restarted by its
supervisor attaches afresh and lands on the least loaded shard then.
On the CPU one serial recogniser process decides one channel's update at a time: 4 tiny.en
channels on 2 cores kept it 99.5 % busy (its updates' round trips ~1.1 s: every channel waited
behind three) while the daemon's own process took 36 % of the other core and the tagger 4 %,
and the rest stood idle. Two serial processes, one thread each, serve two channels each
(:func:`serial_recogniser`; LibriVox and the other project clips, 95 s: words shown p95
2.04-2.24 s against 2.55-3.61 s over three runs with one process).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from subd.service.batching import BatchingSharedWorker
from subd.service.stages import ChannelWorker, SharedWorker
from subd.torch_threads import usable_cores

log = logging.getLogger("subd.service.sharding")
MAX_SHARDS = 64
# auto: at most this many. H200, tiny.en: 4 processes served 256 channels (GPU 74 % busy), 8
# kept up with none of 256 (GPU 92 % busy): without MPS the processes' kernels take turns on
# the GPU, and more contexts cost more switching than they free host time. Under CUDA MPS the
# kernels run side by side and 8 served 512 (set gpu_processes = 8 there: auto does not assume it)
AUTO_MAX_SHARDS = 4


def shard_count(setting: str | int, cuda: bool, cores: int | None = None) -> int:
    """How many batched recogniser processes: ``setting`` as configured (``"auto"`` or N).

    "auto": 1 on the CPU (the cores are the limit there, not one interpreter lock: a second
    model would only share them); on CUDA half the usable cores, at most
    ``AUTO_MAX_SHARDS``: each process keeps about one core busy with its Python work, and the
    daemon's own process (every channel's clock, ingest, publishing) and the tagger need the
    rest."""
    if setting != "auto":
        return int(setting)
    if not cuda:
        return 1
    return max(1, min(AUTO_MAX_SHARDS, (cores or usable_cores()) // 2))


def cpu_process_count(setting: str | int, n_channels: int, cores: int | None = None) -> int:
    """How many serial recogniser processes on the CPU: ``setting`` as configured (``"auto"``
    or N). "auto": one per channel, up to the usable cores and ``AUTO_MAX_SHARDS``; one
    channel keeps its one process (and all the threads a live recogniser takes)."""
    if setting != "auto":
        return int(setting)
    return max(1, min(n_channels, cores or usable_cores(), AUTO_MAX_SHARDS))


def torch_threads_per_shard(n_shards: int, cores: int | None = None) -> int:
    """CPU threads of each shard's torch: the cores shared out, so N processes do not each
    start a thread per core (oversubscribed, they would slow each other's host work)."""
    return max(1, (cores or usable_cores()) // max(n_shards, 1))


class ShardedRecogniser:
    """The recogniser stage as several shards (see module): :class:`BatchingSharedWorker`
    processes, or serial :class:`SharedWorker` ones."""

    def __init__(self, shards: list[SharedWorker]) -> None:
        if not shards:
            raise ValueError("a sharded recogniser needs at least one shard")
        self.shards = shards
        self.name = "recognise"
        self._where: dict[str, int] = {}  # channel -> shard index

    # ---- what the daemon and the bench use ----------------------------------------------------
    def shard_of(self, channel: str) -> int | None:
        return self._where.get(channel)

    def loads(self) -> list[int]:
        """Channels attached to each shard."""
        counts = [0] * len(self.shards)
        for i in self._where.values():
            counts[i] += 1
        return counts

    def _least_loaded(self) -> int:
        loads = self.loads()
        return min(range(len(loads)), key=lambda i: (loads[i], i))

    async def attach(self, channel: str, host: Any) -> ChannelWorker:
        old = self._where.get(channel)
        if old is not None:  # attached again (a channel restarted): to its own shard
            return await self.shards[old].attach(channel, host)
        i = self._least_loaded()
        self._where[channel] = i  # counted at once: channels attaching together spread out
        try:
            return await self.shards[i].attach(channel, host)
        except BaseException:
            self._where.pop(channel, None)
            raise

    async def detach(self, channel: str) -> None:
        i = self._where.pop(channel, None)
        if i is not None:
            await self.shards[i].detach(channel)

    async def start(self, timeout_s: float) -> None:
        """Start every shard's process, together (each loads its model and, on CUDA, captures
        its graphs); the first failure is raised once all have ended."""
        started = await asyncio.gather(*(s.worker.start(timeout_s) for s in self.shards),
                                       return_exceptions=True)
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        log.info("recognise: %d processes started (pids %s)", len(self.shards),
                 ", ".join(str(getattr(s.worker, "pid", "?")) for s in self.shards))

    def keep_spare(self) -> None:
        for s in self.shards:
            s.keep_spare()

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.shards)

    @property
    def n_batches(self) -> int:
        return sum(getattr(s, "n_batches", 0) for s in self.shards)

    @property
    def n_items(self) -> int:
        return sum(getattr(s, "n_items", 0) for s in self.shards)

    async def close(self, timeout_s: float = 1.0) -> None:
        await asyncio.gather(*(s.close(timeout_s) for s in self.shards))


def build_shards(make_worker, n_shards: int, shard: type = BatchingSharedWorker,
                 how: str = "batched processes share the channels",
                 **kwargs: Any) -> ShardedRecogniser:
    """``n_shards`` supervised shards of class ``shard`` (batching, or serial:
    :class:`SharedWorker`); ``make_worker(name, index)`` gives each one's (unstarted) worker,
    named ``recognise.K`` so that health and the logs tell them apart."""
    log.info("recognise: %d %s", n_shards, how)
    return ShardedRecogniser([shard(make_worker(f"recognise.{k}", k), **kwargs)
                              for k in range(n_shards)])


def rows_cap(cfg: Any) -> dict[str, int]:
    """``max_rows`` for a batched host and its worker from ``[recognizer] gpu_max_rows`` (none
    for "auto": the host takes what its share of the GPU allows)."""
    return {} if cfg.gpu_max_rows == "auto" else {"max_rows": int(cfg.gpu_max_rows)}


def batched_recogniser(cfg: Any, *, cuda: bool, max_rows: int | None = None,
                       host_target: str = "subd.service.batching:BatchedMultiplexHost",
                       host_extra: dict | None = None, **kwargs: Any) -> ShardedRecogniser:
    """The daemon's batched recogniser stage from ``[recognizer]`` (``cfg``): its
    ``gpu_processes`` shards, each a process running ``host_target`` (``subd bench gpu``'s
    capacity mode names its own host, which adds a model of another size to each batch).
    ``kwargs`` go to each shard's :class:`BatchingSharedWorker` (policy, on_state);
    ``max_rows`` (else ``gpu_max_rows``) sizes each host's rows and caps the requests its
    worker puts in one batch."""
    from subd.workers.hosts import FactorySpec
    from subd.workers.process import ProcessWorker

    n = shard_count(cfg.gpu_processes, cuda)
    host = {"model": cfg.model, "device": cfg.device, "precision": cfg.precision,
            "threads": torch_threads_per_shard(n) if n > 1 else 0, "share": 1 / n,
            **(host_extra or {})}
    max_rows = rows_cap(cfg).get("max_rows") if max_rows is None else max_rows
    if max_rows is not None:
        host["max_rows"] = max_rows
        kwargs.setdefault("max_rows", max_rows)
    spec = FactorySpec(host_target, host)
    return build_shards(lambda name, _k: ProcessWorker(name, spec), n, **kwargs)


def sharded_recogniser(cfg: Any, batched: bool, **kwargs: Any) -> ShardedRecogniser | None:
    """The daemon's recogniser stage when it is sharded (batched, in processes, and
    ``gpu_processes`` resolving to more than one), else None (one process, as ever)."""
    from subd.config import nvidia_present

    cuda = cfg.device != "cpu" and nvidia_present()
    if not (batched and cfg.process and shard_count(cfg.gpu_processes, cuda) > 1):
        return None
    return batched_recogniser(cfg, cuda=cuda, **kwargs)


def serial_recogniser(cfg: Any, n_channels: int, **kwargs: Any) -> ShardedRecogniser | None:
    """The daemon's serial recogniser stage on the CPU as ``cpu_processes`` processes, each
    loading the model (``cfg.model``) and deciding one channel's update at a time, or None
    where that resolves to one process (one process, as ever). ``kwargs`` go to each shard's
    :class:`SharedWorker` (policy, on_state)."""
    from subd.service.build import serial_host_spec
    from subd.workers.process import ProcessWorker

    n = cpu_process_count(cfg.cpu_processes, n_channels)
    if not cfg.process or n < 2:
        return None
    host = serial_host_spec(cfg.model, share=n, precision=cfg.precision)
    return build_shards(lambda name, _k: ProcessWorker(name, host), n, SharedWorker,
                        "processes share the channels, one update at a time each", **kwargs)
