"""The audio history: float32 samples indexed by absolute sample number, in shared memory.

It is the one copy of a channel's audio. Ingest (the publishing process) writes it; the
recogniser, in its own process, reads its window from it in place through a
:class:`HistoryReader` (its own end mark, no ring of its own). It sits below both the pipeline
and the workers, which is why it is a top-level module.

The writer's end mark lives in the shared segment beside the samples, so a reader in another
process can tell, after copying a span, whether the writer lapped part of it meanwhile (then
that part is zeroed and counted, never passed on as audio from 40 s later). A writer that can
be held back (a file) stays within :func:`writer_lead_samples` of what the recogniser has read,
so this never happens to it.
"""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np

from subd.types import SAMPLE_RATE_HZ

READ_BACK_SAMPLES = 30 * SAMPLE_RATE_HZ  # a reader reads at most this far back from its end
_HEADER_BYTES = 8  # int64 end mark, then the samples (8-byte aligned)


def writer_lead_samples(capacity_samples: int) -> int:
    """How far a writer that can wait may run ahead of the reader's end: a reader reading
    ``READ_BACK_SAMPLES`` back from its end then never meets overwritten samples. (A ring
    shorter than 31 s, in tests, is read back less far: an eighth of it.)"""
    lead = capacity_samples - READ_BACK_SAMPLES
    return lead if lead >= SAMPLE_RATE_HZ else capacity_samples // 8


class AudioHistory:
    """float32 ring indexed by absolute sample number; optionally in shared memory.

    The writer (main process) appends; readers copy ``[start, end)`` out while it is still
    inside the ring. ``capacity_samples`` must exceed the recogniser's window plus its lag.
    """

    def __init__(self, capacity_samples: int, *, shared: bool = False,
                 name: str | None = None) -> None:
        self.capacity = int(capacity_samples)
        nbytes = _HEADER_BYTES + self.capacity * 4
        self._shm: shared_memory.SharedMemory | None = None
        self._owner = False
        if name is not None:  # attach (worker side)
            # workers are spawned by the creator and share its resource tracker, which
            # unlinks the segment once, when the creator does
            self._shm = shared_memory.SharedMemory(name=name)
        elif shared:
            self._shm = shared_memory.SharedMemory(create=True, size=nbytes)
            self._owner = True
        if self._shm is not None:
            raw = self._shm.buf
            end = np.ndarray((1,), dtype=np.int64, buffer=raw)
            buf = np.ndarray((self.capacity,), dtype=np.float32, buffer=raw,
                             offset=_HEADER_BYTES)
            if self._owner:
                end[0] = 0
                buf[:] = 0.0
        else:
            end = np.zeros(1, dtype=np.int64)
            buf = np.zeros(self.capacity, dtype=np.float32)
        self._end = end  # [1] samples [0, end) have been written (shared with readers)
        self._buf = buf  # [capacity] float32

    @property
    def shm_name(self) -> str | None:
        return self._shm.name if self._shm is not None else None

    @property
    def end_sample(self) -> int:
        """Samples ``[0, end_sample)`` have been written (the writer's mark, seen by all)."""
        return int(self._end[0])

    @property
    def start_sample(self) -> int:
        """Oldest sample still held."""
        return max(0, self.end_sample - self.capacity)

    def write(self, start_sample: int, samples: np.ndarray) -> None:
        """Write samples at absolute position ``start_sample`` (must be ≤ end_sample)."""
        n = samples.shape[0]
        if n > self.capacity:
            samples = samples[n - self.capacity :]
            start_sample += n - self.capacity
            n = self.capacity
        pos = start_sample % self.capacity
        first = min(n, self.capacity - pos)
        self._buf[pos : pos + first] = samples[:first]
        if first < n:
            self._buf[: n - first] = samples[first:]
        # the mark moves after the samples are in: a reader that sees it sees them
        self._end[0] = max(self.end_sample, start_sample + n)

    def read_into(self, start_sample: int, out: np.ndarray) -> None:
        """Copy ``out.shape[0]`` samples starting at ``start_sample`` into ``out``."""
        n = out.shape[0]
        if n > self.capacity:
            raise ValueError("read longer than the audio history")
        pos = start_sample % self.capacity
        first = min(n, self.capacity - pos)
        out[:first] = self._buf[pos : pos + first]
        if first < n:
            out[first:] = self._buf[: n - first]

    def read(self, start_sample: int, end_sample: int) -> np.ndarray:
        out = np.empty(end_sample - start_sample, dtype=np.float32)
        self.read_into(start_sample, out)
        return out

    def close(self) -> None:
        if self._shm is None:
            return
        self._buf = np.zeros(0, dtype=np.float32)
        self._end = np.zeros(1, dtype=np.int64)
        shm, self._shm = self._shm, None
        shm.close()
        if self._owner:
            shm.unlink()


class HistoryReader:
    """A reader's view of an :class:`AudioHistory` it does not write (the recogniser's).

    The reader knows the audio up to ``end_sample`` (what it was told is written); reads come
    straight from the history's buffer (shared memory across processes), so the reader keeps
    no copy of the audio. It has the shape the streaming recogniser reads its window through:
    ``start_sample``, ``end_sample`` and ``read``.
    """

    __slots__ = ("history", "end_sample", "n_overwritten")

    def __init__(self, history: AudioHistory, end_sample: int = 0) -> None:
        self.history = history
        self.end_sample = end_sample
        self.n_overwritten = 0  # samples zeroed: the writer had lapped them (live, far behind)

    @property
    def capacity(self) -> int:
        return self.history.capacity

    @property
    def start_sample(self) -> int:
        """Oldest sample still held, as far as this reader knows."""
        return max(0, self.end_sample - self.history.capacity)

    def advance(self, end_sample: int) -> None:
        """Samples up to ``end_sample`` are written (never moves back)."""
        self.end_sample = max(self.end_sample, end_sample)

    def read(self, start_sample: int, end_sample: int) -> np.ndarray:
        """``[start_sample, end_sample)`` as one contiguous array (the decode's input).

        Checked after the copy against the writer's mark: samples the writer overwrote before
        or during it are zeroed (silence), not passed on as the wrong audio."""
        out = self.history.read(start_sample, end_sample)
        lapped = min(self.history.end_sample - self.history.capacity - start_sample,
                     out.shape[0])
        if lapped > 0:
            out[:lapped] = 0.0
            self.n_overwritten += lapped
        return out
