"""Offline transcription of a whole file or stream, window by window, in bounded memory.

Audio arrives in blocks; at most one 30 s window plus one block is held at a time. Each window
is gated by the voice-activity detector (no speech: no decoding, so silence and noise give no
text), decoded with timestamps and temperature fallback, and advanced like the reference
runtime: to the last complete segment's end, or by the whole window when it ends cleanly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from subd.kernels.mel import HOP_SAMPLES
from subd.models.decoding import detect_language
from subd.models.engine import DEFAULT_POLICY, WINDOW_SAMPLES, WhisperEngine
from subd.models.tokenizer import TIME_PRECISION_S
from subd.models.words import user_prompt_tokens, with_user_prompt
from subd.recognise.vad import VoiceActivityDetector
from subd.script import DEFAULT_CHINESE_SCRIPT, script_writer
from subd.types import SAMPLE_RATE_HZ, Word, samples_to_ns

INPUT_STRIDE_FRAMES = 2  # mel frames per encoder frame (one timestamp step = 2 × 10 ms)
UNHEARD_SPEECH_SAMPLES = SAMPLE_RATE_HZ  # speech after the transcript's end: decode it again
ALIGN_SLACK_FRAMES = 20  # ... and its words are aligned up to 0.2 s past that end


@dataclass(frozen=True, slots=True)
class Segment:
    start_ns: int
    end_ns: int
    text: str
    words: tuple[Word, ...]


@dataclass(frozen=True, slots=True)
class TranscribeOptions:
    vad: bool = True
    condition_on_previous_text: bool = True
    word_timestamps: bool = True
    # None: the engine's language; "auto": identified on the first window with speech and kept
    language: str | None = None
    chinese_script: str = DEFAULT_CHINESE_SCRIPT  # subd.script.CHINESE_SCRIPTS
    prompt: str = ""  # names and terms to expect, before every window's previous text


def _split_segments(
    tokens: list[int], ts_begin: int
) -> tuple[list[tuple[int, int, list[int]]], int | None]:
    """Timestamp-delimited segments [(start_step, end_step, tokens)] and how far to seek.

    Returns the seek advance in mel frames, or None for "the whole window".
    """
    single_ending = len(tokens) >= 2 and tokens[-2] < ts_begin <= tokens[-1]
    consecutive = [
        i for i in range(1, len(tokens)) if tokens[i] >= ts_begin and tokens[i - 1] >= ts_begin
    ]
    if not consecutive:
        stamps = [t for t in tokens if t >= ts_begin]
        end = (stamps[-1] - ts_begin) if stamps and stamps[-1] != ts_begin else None
        start = (tokens[0] - ts_begin) if tokens and tokens[0] >= ts_begin else 0
        return [(start, end if end is not None else -1, tokens)], None
    slices = consecutive + ([len(tokens)] if single_ending else [])
    out, last = [], 0
    for cut in slices:
        piece = tokens[last:cut]
        out.append((piece[0] - ts_begin, piece[-1] - ts_begin, piece))
        last = cut
    if single_ending:
        return out, None
    return out, (tokens[last - 1] - ts_begin) * INPUT_STRIDE_FRAMES


def _seek_to_unheard(last_end_step: int, regions: list[tuple[int, int]]) -> int | None:
    """Where the next window starts when Whisper ended its transcript early: the end of its
    last segment (mel frames), if the detector hears ``UNHEARD_SPEECH_SAMPLES`` of speech after
    it; None keeps the reference runtime's rule (the whole window). Whisper sometimes closes
    a window after one sentence with an end-of-text, the rest of the window still speech: on
    the held-out set as one 103.5 s stream, the window at 78.8 s gave one sentence and the last
    20 s of the file were never transcribed."""
    if last_end_step <= 0:
        return None
    # at least a second on: a window that keeps ending on a sliver of transcript (noise read as
    # a word) costs a decode per second of audio, not one per timestamp step
    frames = max(last_end_step * INPUT_STRIDE_FRAMES, UNHEARD_SPEECH_SAMPLES // HOP_SAMPLES)
    cut = frames * HOP_SAMPLES
    unheard = sum(max(0, end - max(start, cut)) for start, end in regions)
    return frames if unheard >= UNHEARD_SPEECH_SAMPLES else None


class Transcriber:
    def __init__(self, engine: WhisperEngine, options: TranscribeOptions = TranscribeOptions()):
        self.engine = engine
        self.options = options
        self.vad = VoiceActivityDetector() if options.vad else None
        self.language = options.language if options.language != "auto" else None
        self._identify = options.language == "auto" and engine.tokenizer.multilingual
        self._user_prompt = user_prompt_tokens(engine.tokenizer, options.prompt)

    def transcribe_blocks(
        self,
        blocks: Iterable[np.ndarray],
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[Segment]:
        """Yield segments as windows complete; ``progress`` gets the samples consumed so far."""
        buf = np.zeros(0, np.float32)
        buf_start = 0  # sample index of buf[0] on the audio timeline
        prompt: list[int] = []
        exhausted = False
        it = iter(blocks)
        while True:
            while not exhausted and buf.shape[0] < WINDOW_SAMPLES:
                block = next(it, None)
                if block is None:
                    exhausted = True
                else:
                    buf = np.concatenate([buf, block.astype(np.float32, copy=False)])
            if buf.shape[0] == 0 or (exhausted and buf.shape[0] < HOP_SAMPLES):
                break
            window = buf[:WINDOW_SAMPLES]
            advance, segments, prompt = self._window(window, buf_start, prompt)
            yield from segments
            advance = max(advance, HOP_SAMPLES)  # always make progress
            buf = buf[advance:]
            buf_start += advance
            if progress is not None:
                progress(buf_start)
        if progress is not None:
            progress(buf_start + buf.shape[0])

    def _window(
        self, window: np.ndarray, start_sample: int, prompt: list[int]
    ) -> tuple[int, list[Segment], list[int]]:
        n = window.shape[0]
        regions = self.vad.speech_regions(window) if self.vad is not None else None
        if regions == []:
            return n, [], prompt
        eng = self.engine
        ts_begin = eng.tokenizer.special.timestamp_begin
        mel = eng.features(window)
        n_frames = min(mel.shape[-1] - 1, n // HOP_SAMPLES)
        feats = eng.encode(mel)
        if self._identify:
            probs = detect_language(eng.model.decoder, feats, eng.tokenizer)
            self.language, self._identify = max(probs, key=probs.__getitem__), False
        result = eng.decode_with_fallback(
            feats, with_user_prompt(self._user_prompt, prompt if
                                    self.options.condition_on_previous_text else None),
            language=self.language,
        )
        if DEFAULT_POLICY.silent(result) or not result.tokens:
            return n, [], prompt
        pieces, seek_frames = _split_segments(list(result.tokens), ts_begin)
        if seek_frames is None and regions:
            seek_frames = _seek_to_unheard(pieces[-1][1], regions)
            if seek_frames is not None:
                # the words lie before the transcript's end: aligned over the whole window, DTW
                # stretched its last words over the speech left for the next one ("Allen said,"
                # timed at the file's end, and every later cue after it)
                n_frames = min(n_frames, seek_frames + ALIGN_SLACK_FRAMES)
        kept_tokens = [t for _, _, piece in pieces for t in piece]
        text_tokens = [t for t in kept_tokens if t < ts_begin]
        timings = (eng.align(feats, text_tokens, n_frames, language=self.language)
                   if self.options.word_timestamps else [])
        window_s = n / SAMPLE_RATE_HZ
        write = script_writer(self.options.chinese_script, self.language) or (lambda t: t)
        segments = []
        cursor = 0
        for start_step, end_step, piece in pieces:
            piece_text = [t for t in piece if t < ts_begin]
            if not piece_text:
                continue
            words: list[Word] = []
            consumed = 0
            while cursor < len(timings) and consumed < len(piece_text):
                w = timings[cursor]
                consumed += len(w.tokens)
                cursor += 1
                words.append(
                    Word(
                        text=write(w.text.strip()),
                        start_ns=samples_to_ns(start_sample) + int(min(w.start_s, window_s) * 1e9),
                        end_ns=samples_to_ns(start_sample) + int(min(w.end_s, window_s) * 1e9),
                        probability=w.probability,
                    )
                )
            seg_start_s = start_step * TIME_PRECISION_S
            seg_end_s = window_s if end_step < 0 else end_step * TIME_PRECISION_S
            segments.append(
                Segment(
                    start_ns=samples_to_ns(start_sample) + int(min(seg_start_s, window_s) * 1e9),
                    end_ns=samples_to_ns(start_sample) + int(min(seg_end_s, window_s) * 1e9),
                    text=write(eng.tokenizer.decode(piece_text).strip()),
                    words=tuple(words),
                )
            )
        next_prompt = [] if result.temperature > 0.5 else prompt + kept_tokens
        advance = n if seek_frames is None else seek_frames * HOP_SAMPLES
        return min(advance, n), segments, next_prompt
