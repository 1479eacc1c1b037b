"""How far a streaming hypothesis accounts for all speech (its "settled" audio end).

The tagger reads the gap after the last word as a pause, so that gap must hold no speech: the
settled end is the first speech after the last hypothesis word, or the audio end when none
follows. Speech is looked for frame by frame (30 ms), not in VAD regions: a region needs 250 ms
of speech, and the onset of a word not transcribed yet (Whisper often leaves the window's last
word out), or a short word, is less. A short burst right at the last word's end is that word's
own remainder (DTW ends are often early), not a new word; so is a longer one, up to
``LONG_REMAINDER_MS``, that silence of ``REMAINDER_SILENCE_MS`` follows: the end of a sentence's
last word, which Whisper aligns 200-300 ms early ("ill-disposed." on the dev set: the pause
after it read as 0 ms, and its full stop was set aside as a window edge's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from subd.recognise.vad import FRAME_SAMPLES, VoiceActivityDetector
from subd.types import SAMPLE_RATE_HZ, Word, ns_to_samples, samples_to_ns

# speech after the last word is 60 ms of voiced frames (a word onset, a short word); bursts
# closer than 90 ms are one; a burst touching the last word and ending within 150 ms of it is
# that word's own end
SETTLE_MIN_SPEECH_MS = 60
SETTLE_JOIN_MS = 90
SETTLE_PAD_MS = 60
REMAINDER_MS = 150
LONG_REMAINDER_MS = 300
REMAINDER_SILENCE_MS = 300


def settled_end(vad: VoiceActivityDetector | None, audio, window_start: int,
                last_end: int | None, end: int) -> int:
    """Samples: the hypothesis (last word ending at sample ``last_end``, None: no word) accounts
    for all speech before the returned sample. ``audio`` has ``read(first, end)``."""
    if vad is None:
        return end if last_end is None else min(end, last_end)
    first = window_start if last_end is None else last_end
    first = min(end, max(first, window_start))
    onset = speech_onset(vad, audio, first, end) if first < end else None
    return end if onset is None else onset


def has_speech(vad: VoiceActivityDetector, audio, first: int, end: int) -> bool:
    """Any VAD speech region in samples [first, end) of the stream ``audio``? (The stream's
    frames are analysed once: VoiceActivityDetector.regions_at.)"""
    return first < end and bool(vad.regions_at(audio, first, end))


def speech_onset(vad: VoiceActivityDetector, audio, first: int, end: int) -> int | None:
    """First sample of speech in [first, end) (a short burst at ``first`` skipped)."""
    regions = vad.regions_at(
        audio, first, end, min_speech_ms=SETTLE_MIN_SPEECH_MS,
        min_silence_ms=SETTLE_JOIN_MS, pad_ms=SETTLE_PAD_MS,
        min_voiced_run_ms=SETTLE_MIN_SPEECH_MS,
    )
    pad = SETTLE_PAD_MS * SAMPLE_RATE_HZ // 1000
    remainder = REMAINDER_MS * SAMPLE_RATE_HZ // 1000
    if regions and regions[0][0] == 0:
        burst_end = regions[0][1] - pad
        silence_to = regions[1][0] + pad if len(regions) > 1 else end - first
        if burst_end <= remainder or (
                burst_end <= LONG_REMAINDER_MS * SAMPLE_RATE_HZ // 1000
                and silence_to - burst_end >= REMAINDER_SILENCE_MS * SAMPLE_RATE_HZ // 1000):
            regions = regions[1:]
    return first + regions[0][0] if regions else None


def utterance_end(vad: VoiceActivityDetector, audio, words: Sequence[Word], window_start: int,
                  end: int, pause_ms: int, context_ms: int = 0) -> int:
    """How many leading ``words`` (a hypothesis) end an utterance: a pause of ``pause_ms``
    without speech follows the last of them. ``context_ms`` 0: only the pause up to the audio
    end after the last word counts (the speaker has stopped). Else only a pause that speech
    follows, heard for ``context_ms`` (samples counted from the first VAD region after the
    pause): the decode heard the utterance and what comes after it (why: cjk_policy)."""
    if not words:
        return 0
    pause = pause_ms * SAMPLE_RATE_HZ // 1000
    context = context_ms * SAMPLE_RATE_HZ // 1000
    for n in range(len(words), 0, -1) if context else (len(words),):
        first = max(ns_to_samples(words[n - 1].end_ns), window_start)
        if first >= end:
            continue
        regions = vad.regions_at(audio, first, end)
        if not context:
            return n if end - first >= pause and not regions else 0
        if regions and regions[0][0] >= pause and end - first - regions[0][0] >= context:
            return n
    return 0


def utterance_start(vad: VoiceActivityDetector, audio, first: int, at: int) -> int:
    """Where the utterance that runs into sample ``at`` begins: the start of the last VAD
    speech region in [first, at) (its padding included), or ``at`` itself where a pause is
    there already or where the speech runs back to ``first`` (no pause found to start at)."""
    if first >= at:
        return at
    regions = vad.regions_at(audio, first, at)
    if not regions or first + regions[-1][1] < at or regions[-1][0] == 0:
        return at
    return first + regions[-1][0]


# a word is heard when a speech onset lies within this of it: DTW moves word edges by
# 100-200 ms, and a short word squeezed to no duration sits at the edge of the speech it was
HEARD_MARGIN_MS = 150
# ... and speech is 90 ms of voiced frames in a row, the VAD's own shortest run: room tone
# before a speaker can pass for 60 ms of it (the dev set's AMI clip: two frames, 1 s before
# its first word, and "in" of the copy above was timed 50 ms from them)
HEARD_MIN_SPEECH_MS = 90


def _speech(vad: VoiceActivityDetector, audio, first: int, end: int) -> list[tuple[int, int]]:
    """Speech in samples [``first``, ``end``) as words are judged against it: absolute
    [start, end) ranges, runs of at least ``HEARD_MIN_SPEECH_MS`` of voiced frames."""
    return [(first + a, first + b) for a, b in vad.regions_at(
        audio, first, end, min_speech_ms=HEARD_MIN_SPEECH_MS, min_silence_ms=SETTLE_JOIN_MS,
        pad_ms=SETTLE_PAD_MS, min_voiced_run_ms=HEARD_MIN_SPEECH_MS)]


def heard(vad: VoiceActivityDetector, audio, words: Sequence[Word], first: int,
          end: int, stream_end: bool = False) -> list[Word]:
    """The ``words`` with speech under them, of samples [``first``, ``end``). Whisper writes
    words over silence: after a clip's last words, "In this regard," came back over the 2 s of
    silence that followed ("in this regard, in this regard"), timed there by DTW, and was
    committed at its deadline. Only a word heard out is judged: one within ``HEARD_MARGIN_MS``
    of the audio end is kept, as the VAD has not yet decided what follows it (judged there,
    held-out D = 1 s lost its commas: 0.50 -> 0.00). Speech is found once, from the first
    word judged to the audio end, so a region is seen whole, not cut at a word's margin.
    At the ``stream_end`` nothing follows the audio: every word is judged (the final decode of
    a clip read "The" with probability 0.00 on the silence at its very end, D = 0.5 s)."""
    margin = HEARD_MARGIN_MS * SAMPLE_RATE_HZ // 1000
    spans = [(max(first, ns_to_samples(w.start_ns) - margin), ns_to_samples(w.end_ns) + margin)
             for w in words]
    judged = [lo < hi and (stream_end or hi <= end - FRAME_SAMPLES) for lo, hi in spans]
    if not any(judged):
        return list(words)
    speech = _speech(vad, audio, min(lo for (lo, _), j in zip(spans, judged, strict=True) if j),
                     end)
    return [w for w, (lo, hi), j in zip(words, spans, judged, strict=True)
            if not j or any(a < hi and b > lo for a, b in speech)]


# a word's end is moved back to the end of the speech under it when it runs on this far into
# silence the VAD has decided (the silence ends at least HEARD_MARGIN_MS before the audio end)
OVERRUN_MS = 300


def overruns_cut(vad: VoiceActivityDetector | None, audio, words: Sequence[Word],
                 first: int) -> list[Word]:
    """``words`` with an end that runs on over decided silence moved back to the end of the
    speech under the word. DTW stretches a decode's last word to the audio end while the
    speaker has stopped: zh-dev's "了吧" (56.16-56.58 s) was timed 56.52-56.96, 56.96-57.36 and
    57.26-57.66 by three decodes in a row, each end at its window's end, so it was never heard
    out nor due, and was shown 2.65-2.85 s after it was said (D = 2 s)."""
    if vad is None or not words:
        return list(words)
    end = audio.end_sample
    decided = end - HEARD_MARGIN_MS * SAMPLE_RATE_HZ // 1000
    lo0 = max(first, ns_to_samples(words[0].start_ns))
    if lo0 >= decided:
        return list(words)
    speech = _speech(vad, audio, lo0, end)
    overrun = OVERRUN_MS * SAMPLE_RATE_HZ // 1000
    remainder = LONG_REMAINDER_MS * SAMPLE_RATE_HZ // 1000
    out: list[Word] = []
    for w in words:
        hi = ns_to_samples(w.end_ns)
        before = out[-1].end_ns if out else samples_to_ns(first)
        # the end of the last speech that starts before the word's end and after the word
        # before it: under the word, or, for a word moved wholly onto the silence after it,
        # the speech no other word accounts for
        ends = [b for a, b in speech if a < hi and b > ns_to_samples(before)]
        stop = max(ends) if ends else None
        # ... if that speech is more than the remainder of the word before it (its end, which
        # DTW aligns up to LONG_REMAINDER_MS early: a copy of "regard," written over the silence
        # after it is not moved onto the last 160 ms of its speech)
        if stop is not None and stop - ns_to_samples(before) > remainder \
                and stop + overrun <= hi and stop <= decided:
            start = max(before, min(w.start_ns, samples_to_ns(stop) - (w.end_ns - w.start_ns)))
            if start < samples_to_ns(stop):
                w = replace(w, start_ns=start, end_ns=samples_to_ns(stop))
        out.append(w)
    return out
