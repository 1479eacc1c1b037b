"""Every channel's streaming policy, one batched engine: the policy decides, the engine batches.

Each channel keeps its own :class:`~subd.recognise.streaming.StreamingRecognizer` (its window,
commit point, VAD, deadline-aware decisions), unchanged: it is handed a :class:`BatchingEngine`
as its engine. :meth:`BatchingEngine.run` runs one request of each channel (``update``,
``finish``) in a thread of its own; when a channel's policy calls ``transcribe_window`` its
thread waits, and once every running channel waits or is done, the waiting windows go to
:class:`~subd.models.batched_window.WindowEngine` as ONE batch and each thread resumes with its
own result. A policy that decodes twice in one update (or not at all) just joins the next batch
or none. Threads here are cheap: they wait, and the model work runs in native code without the
GIL.

A channel whose policy raises gets its own exception back; the others' results stand. A failure
of the batch itself (the engine) is every waiting channel's exception.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from subd.models.batched_window import WindowEngine, WindowJob
from subd.models.engine import DEFAULT_OPTIONS, DEFAULT_POLICY, FULL_SPAN


@dataclass(slots=True)
class _Waiting:
    job: WindowJob
    result: Any = None
    error: BaseException | None = None
    # set once the result is in: each channel thread waits on its own event, so a batch wakes
    # each waiting thread once (one shared condition woke all N at every arrival: N^2 wakeups)
    ready: threading.Event = field(default_factory=threading.Event)


@dataclass(slots=True)
class BatchStats:
    n_batches: int = 0
    n_windows: int = 0
    batch_sizes: list[int] = field(default_factory=list)  # the last 4096

    @property
    def mean_batch(self) -> float:
        return self.n_windows / self.n_batches if self.n_batches else 0.0


class BatchingEngine:
    """What each channel's recogniser sees as its engine (``tokenizer``, ``transcribe_window``,
    ``detect_language``... the single-stream engine's attributes for the rest)."""

    def __init__(self, windows: WindowEngine) -> None:
        self.windows = windows
        self.tokenizer = windows.tokenizer
        self.stats = BatchStats()
        self._cond = threading.Condition()
        self._waiting: list[_Waiting] = []
        self._active = 0
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    def __getattr__(self, name: str) -> Any:  # loaded, sot_sequence, detect_language, ...
        return getattr(self.windows.single, name)

    # ---- what the policy calls --------------------------------------------------------------
    def transcribe_window(self, audio: np.ndarray, previous_tokens: list[int] | None = None,
                          policy=DEFAULT_POLICY, options=DEFAULT_OPTIONS,
                          prefix: tuple[int, ...] = (),
                          retry_without_prefix: Callable[[], bool] | None = None,
                          span=FULL_SPAN, language: str | None = None):
        job = WindowJob(np.asarray(audio, dtype=np.float32), previous_tokens, policy, options,
                        tuple(prefix), retry_without_prefix, span, language)
        if not getattr(self._local, "in_run", False):  # called outside run(): a batch of one
            return self._unwrap(self._batch([job])[0])
        waiting = _Waiting(job)
        with self._cond:
            self._waiting.append(waiting)
            if len(self._waiting) == self._active:  # the last one: run() serves the batch
                self._cond.notify()
        waiting.ready.wait()
        if waiting.error is not None:
            raise waiting.error
        return waiting.result

    @staticmethod
    def _unwrap(result: Any) -> Any:
        if isinstance(result, BaseException):
            raise result
        return result

    def _batch(self, jobs: list[WindowJob]) -> list[Any]:
        self.stats.n_batches += 1
        self.stats.n_windows += len(jobs)
        self.stats.batch_sizes.append(len(jobs))
        del self.stats.batch_sizes[:-4096]
        return self.windows.transcribe(jobs)

    # ---- one request per channel, decoded together -----------------------------------------
    def run(self, calls: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
        """Run ``calls`` (each one channel's request) concurrently; (True, value) or (False,
        exception) per call, in order."""
        if not calls:
            return []
        if len(calls) > self._pool_size:  # every call needs its own thread: they wait
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            self._pool_size = max(len(calls), 2 * self._pool_size, 8)
            self._pool = ThreadPoolExecutor(self._pool_size, thread_name_prefix="subd-channel")
        out: list[tuple[bool, Any]] = [(False, None)] * len(calls)

        def one(i: int, call: Callable[[], Any]) -> None:
            self._local.in_run = True
            try:
                out[i] = (True, call())
            except BaseException as exc:  # noqa: BLE001 - that channel's failure only
                out[i] = (False, exc)
            finally:
                self._local.in_run = False
                with self._cond:
                    self._active -= 1
                    if self._active == 0 or len(self._waiting) == self._active:
                        self._cond.notify()  # only run() waits on the condition

        with self._cond:
            self._active = len(calls)
        for i, call in enumerate(calls):
            self._pool.submit(one, i, call)
        with self._cond:
            while self._active > 0:
                if self._waiting and len(self._waiting) == self._active:
                    batch, self._waiting = self._waiting, []
                    self._cond.release()
                    try:
                        self._serve(batch)
                    finally:
                        self._cond.acquire()
                else:
                    self._cond.wait()
        return out

    def _serve(self, batch: list[_Waiting]) -> None:
        try:
            results = self._batch([w.job for w in batch])
        except BaseException as exc:  # noqa: BLE001 - every waiting channel hears of it
            for w in batch:
                w.error = exc
                w.ready.set()
            return
        for w, r in zip(batch, results, strict=True):
            if isinstance(r, BaseException):
                w.error = r
            else:
                w.result = r
            w.ready.set()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
