"""The data that flows through subd: one frozen dataclass per kind.

All times are on the *audio timeline* (position of a sample in the 16 kHz mono stream) and are
exposed as integer nanoseconds (``*_ns``). Wall-clock/monotonic times appear only in
``CaptionState.due_ns`` and ``sent_ns`` (see DESIGN.md, "Time").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SAMPLE_RATE_HZ = 16_000
NS_PER_SAMPLE = 1_000_000_000 // SAMPLE_RATE_HZ  # 62_500 ns, exact


def samples_to_ns(n_samples: int) -> int:
    return int(n_samples) * NS_PER_SAMPLE


def ns_to_samples(t_ns: int) -> int:
    return int(t_ns) // NS_PER_SAMPLE


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """Mono 16 kHz float32 audio starting at ``start_sample`` on the audio timeline."""

    start_sample: int
    samples: np.ndarray = field(repr=False)  # float32 [n_samples]

    @property
    def n_samples(self) -> int:
        return int(self.samples.shape[0])

    @property
    def start_ns(self) -> int:
        return samples_to_ns(self.start_sample)

    @property
    def end_ns(self) -> int:
        return samples_to_ns(self.start_sample + self.n_samples)


@dataclass(frozen=True, slots=True)
class Features:
    """Log-mel frames (100 frames/s) starting at ``start_frame`` (10 ms units)."""

    start_frame: int
    mel: np.ndarray = field(repr=False)  # float32 [n_mels, n_frames]


@dataclass(frozen=True, slots=True)
class Word:
    """A recognised word. ``text`` is the recogniser's spelling (no leading space).
    ``joined``: the rest of the word before it, which was committed cut short and which a later
    decode continued ("letter" + "press"): shown without a space between them."""

    text: str
    start_ns: int
    end_ns: int
    probability: float = 1.0
    joined: bool = False
    # (p('.'), p(',')) as Whisper weighed them after the word's letters, whatever it wrote there
    # (None: not known); evidence for the punctuation, not part of the word's identity
    mark_p: tuple[float, float] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """What the streaming recogniser knows after an update.

    ``committed`` holds only the words newly committed by this update (never retracted);
    ``tentative`` is the current unconfirmed tail, which later updates may change.
    ``audio_end_ns``: the hypothesis accounts for all speech before this time (later audio may
    already have arrived but still hold words not recognised yet).
    """

    committed: tuple[Word, ...]
    tentative: tuple[Word, ...]
    audio_end_ns: int


# [recognizer] encoder_span: what each update encodes (subd.pipeline.deadline)
ENCODER_SPANS = ("auto", "cut", "full")
DEFAULT_ENCODER_SPAN = "cut"


@dataclass(frozen=True, slots=True)
class UpdateCosts:
    """What one recogniser update took, by encoder span, measured by the recogniser's process
    before a channel's first words (subd.recognise.warmup): the update planner's first
    expectation (subd.pipeline.deadline) until the channel's own updates are measured."""

    full_ns: int  # Whisper's whole 30 s input
    cut_ns: int  # the recogniser's cut span


@dataclass(frozen=True, slots=True)
class TaggedWord:
    """A word after punctuation/capitalisation restoration.

    ``punct`` is the mark after the word ("", ",", ".", "?", "!"); ``case`` is one of
    "lower", "cap", "upper"; ``break_after`` is the tagger's preference (0..1) for ending a
    subtitle line/cue after this word; ``final`` says the punctuation/case are committed.
    """

    word: Word
    text: str
    punct: str = ""
    case: str = "lower"
    break_after: float = 0.0
    final: bool = False


@dataclass(frozen=True, slots=True)
class Cue:
    """One subtitle cue: up to N lines, times on the audio timeline."""

    index: int
    start_ns: int
    end_ns: int
    lines: tuple[str, ...]
    committed: bool = True


@dataclass(frozen=True, slots=True)
class CaptionState:
    """The state published at tick ``k`` (covers audio up to the end of tick k).

    ``due_ns`` is the monotonic publication deadline T(k) = t0 + (k+1)·P + D.
    ``committed`` holds the words newly committed at this tick; ``tentative`` is the current
    tentative tail as display text. ``fallback`` marks a tick whose own state was not ready.
    """

    k: int
    due_ns: int
    audio_end_ns: int
    committed: tuple[TaggedWord, ...] = ()
    tentative: str = ""
    cues: tuple[Cue, ...] = ()
    fallback: bool = False
    degraded: bool = False
