"""Capacity mode's decisions from a transcript (``subd bench gpu --capacity SIZE``, the default
``--capacity-decisions transcript``).

The model of SIZE has random weights, so its own tokens mean nothing. Each window a channel's
policy asks for is answered from a transcript of the bench's clips instead: the real model's
offline reading of the whole library (``subd transcribe``'s path, made once by the bench before
any trial and handed to every recogniser process), with its word times. The window is found
in the library by its samples (every channel plays the library from its own offset, so a
window's audio is an exact slice of it), and the answer is what Whisper writes for it: the
forced prefix (the channel's committed words in the window), then the transcript's words after
them that the window holds in full, in one timestamped segment. The random model then does a
deployed model's whole work for that answer (encoder, decoder teacher-forced through the same
tokens, word-timing pass and DTW: subd.bench.gpu_capacity), and the real model does none. The
policy, its commits, deadlines and VAD run as in the daemon; the captions are the transcript's
words.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from subd.models.alignment import WordTiming
from subd.models.batched_window import WindowEngine, WindowJob
from subd.models.decoding import DecodeResult, compression_ratio
from subd.models.engine import WINDOW_SAMPLES, WindowResult
from subd.types import SAMPLE_RATE_HZ

TIMESTAMP_S = 0.02  # Whisper's timestamp tokens


@dataclass(frozen=True, slots=True)
class TranscriptWord:
    start: int  # samples into the library
    end: int
    text: str  # with its leading space, as the tokenizer spells it
    tokens: tuple[int, ...]
    probability: float


class LibraryIndex:
    """Where a window's audio sits in a library that channels play round and round."""

    def __init__(self, library: np.ndarray) -> None:
        self.n = len(library)
        reps = 1 + -(-WINDOW_SAMPLES // max(self.n, 1))  # room for a window past the end
        self.audio = np.tile(library.astype(np.float32, copy=False), reps + 1)
        self.order = np.argsort(library, kind="stable")
        self.values = library[self.order]

    def find(self, window: np.ndarray) -> int | None:
        """The library position of ``window[0]`` (0..n-1), None where the window is silence or
        not in the library."""
        nonzero = np.flatnonzero(window)
        if not len(nonzero) or len(window) > len(self.audio) - self.n:
            return None
        j = int(nonzero[0])  # leading zeros match everywhere: anchor on the first sample heard
        lo, hi = np.searchsorted(self.values, window[j], "left"), \
            np.searchsorted(self.values, window[j], "right")
        cands = (self.order[lo:hi].astype(np.int64) - j) % self.n
        k = j + 1
        while len(cands) > 1 and k < len(window):
            cands = cands[self.audio[cands + k] == window[k]]
            k += 1
        for c in cands:
            if np.array_equal(self.audio[c : c + len(window)], window):
                return int(c)
        return None


def library_transcript(engine, library: np.ndarray) -> list[TranscriptWord]:
    """The real model's offline reading of ``library`` (subd.recognise.offline), word by word,
    timed in library samples."""
    from subd.recognise.offline import TranscribeOptions, Transcriber

    tok = engine.tokenizer
    out = []
    for seg in Transcriber(engine, TranscribeOptions()).transcribe_blocks(iter([library])):
        for w in seg.words:
            text = " " + w.text
            out.append(TranscriptWord(w.start_ns * SAMPLE_RATE_HZ // 1_000_000_000,
                                      w.end_ns * SAMPLE_RATE_HZ // 1_000_000_000, text,
                                      tuple(tok.encode(text)), float(w.probability)))
    return out


class TranscriptWindows:
    """What the batching engine calls (``transcribe``, ``single``, ``tokenizer``, ``warm``),
    answering every window from the library's transcript; no model work."""

    def __init__(self, real: WindowEngine, library: np.ndarray,
                 words: list[TranscriptWord]) -> None:
        self.real = real
        self.single, self.tokenizer, self.batched = real.single, real.tokenizer, real.batched
        self.index = LibraryIndex(library)
        n = len(library)
        # the words of as many more rounds of the library as a window may run into
        self.words = [w if r == 0 else TranscriptWord(w.start + r * n, w.end + r * n, w.text,
                                                      w.tokens, w.probability)
                      for r in range(2 + WINDOW_SAMPLES // max(n, 1)) for w in words]
        self.starts = np.array([w.start for w in self.words], dtype=np.int64)
        self.n_windows = 0
        self.n_unfound = 0  # windows with sound that are not in the library (answered silent)
        self.n_prefix_mismatch = 0  # forced prefixes that are not the transcript's words

    def summary(self) -> str:
        return (f"transcript: {self.n_windows} windows answered, {self.n_unfound} with sound "
                f"not found in the library, {self.n_prefix_mismatch} forced prefixes not the "
                f"transcript's words")

    def warm(self) -> None:
        """Nothing to warm: the real model does no work here."""

    def transcribe(self, jobs: list[WindowJob]) -> list[WindowResult | BaseException]:
        return [self.answer(job) for job in jobs]

    def answer(self, job: WindowJob) -> WindowResult:
        self.n_windows += 1
        sp = self.tokenizer.special
        audio = job.audio[:WINDOW_SAMPLES]
        at = self.index.find(audio)
        if at is None:
            self.n_unfound += bool(np.any(audio))
            return self._result((), (), False)
        first = int(np.searchsorted(self.starts, at, "left"))
        last = int(np.searchsorted(self.starts, at + len(audio), "left"))
        inside = self.words[first:last]
        # the forced prefix is the channel's committed words in the window: the transcript's
        # first words there (the policy only ever committed this transcript's words)
        n_known = sum(1 for t in job.prefix if t < sp.timestamp_begin)
        m, n_tok = 0, 0
        while m < len(inside) and n_tok < n_known:
            n_tok += len(inside[m].tokens)
            m += 1
        if n_known and list(job.prefix[1:]) != [t for w in inside[:m] for t in w.tokens]:
            self.n_prefix_mismatch += 1
        new = [w for w in inside[m:] if w.end <= at + len(audio)]
        tokens = list(job.prefix)
        if new:
            if not tokens:
                tokens.append(sp.timestamp_begin)
            tokens += [t for w in new for t in w.tokens]
        if tokens:
            end_s = max(0.0, (new[-1].end - at) / SAMPLE_RATE_HZ) if new else 0.0
            tokens.append(sp.timestamp_begin + min(round(end_s / TIMESTAMP_S),
                                                   WINDOW_SAMPLES // 320))
        timings = tuple(WordTiming(w.text, w.tokens, (w.start - at) / SAMPLE_RATE_HZ,
                                   (w.end - at) / SAMPLE_RATE_HZ, w.probability) for w in new)
        return self._result(tuple(tokens), timings, bool(job.prefix),
                            "".join(w.text for w in inside[:m] + new))

    @staticmethod
    def _result(tokens: tuple[int, ...], words: tuple[WordTiming, ...], prefix_used: bool,
                text: str = "") -> WindowResult:
        n = max(1, len(tokens))
        decode = DecodeResult(tokens, -0.1 * n, -0.1, 0.01 if tokens else 0.99, 0.0,
                              compression_ratio(text), False)
        return WindowResult(decode, words, bool(tokens), prefix_used)
