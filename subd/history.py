"""The audio history: float32 samples indexed by absolute sample number, in shared memory.

It is the one copy of a channel's audio. Ingest (the publishing process) writes it; the
recogniser, in its own process, reads its window from it in place. It sits below both the
pipeline and the workers, which is why it is a top-level module.
"""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np


class AudioHistory:
    """float32 ring indexed by absolute sample number; optionally in shared memory.

    The writer (main process) appends; readers copy ``[start, end)`` out while it is still
    inside the ring. ``capacity_samples`` must exceed the recogniser's window plus its lag.
    """

    def __init__(self, capacity_samples: int, *, shared: bool = False,
                 name: str | None = None) -> None:
        self.capacity = int(capacity_samples)
        nbytes = self.capacity * 4
        self._shm: shared_memory.SharedMemory | None = None
        self._owner = False
        if name is not None:  # attach (worker side)
            # workers are spawned by the creator and share its resource tracker, which
            # unlinks the segment once, when the creator does
            self._shm = shared_memory.SharedMemory(name=name)
            buf = np.ndarray((self.capacity,), dtype=np.float32, buffer=self._shm.buf)
        elif shared:
            self._shm = shared_memory.SharedMemory(create=True, size=nbytes)
            self._owner = True
            buf = np.ndarray((self.capacity,), dtype=np.float32, buffer=self._shm.buf)
            buf[:] = 0.0
        else:
            buf = np.zeros(self.capacity, dtype=np.float32)
        self._buf = buf
        self.end_sample = 0  # samples [0, end_sample) have been written (writer side)

    @property
    def shm_name(self) -> str | None:
        return self._shm.name if self._shm is not None else None

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
        self.end_sample = max(self.end_sample, start_sample + n)

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
        shm, self._shm = self._shm, None
        shm.close()
        if self._owner:
            shm.unlink()
