"""Streaming recognition over the Whisper engine: a sliding window and a commit policy.
Policy (subd.recognise.commit): in the pipeline a word is committed at its deadline, from the
hypothesis with the most right context that is in by then (``update(commit_until_ns)``); driven
alone, LocalAgreement-2 with bounded lag, as follows.

* Each ``update`` decodes the window [window_start, audio_end) with the user's prompt
  (``set_prompt``) and the committed text as its context, on Whisper's whole 30 s input or a
  cut span (``update(full_span)``).
* Words of the new hypothesis that lie before the commit point are dropped; a word is committed
  when two consecutive hypotheses that both heard it out agree on it (same normalised text, in
  order) and Whisper gave it at least ``agree_min_probability`` in both — or, for a word it stays
  unsure of, when ``unsure_agree_decodes`` decodes in a row agree; or on its first decode when
  Whisper is sure of it (probability ≥ ``confident_min_probability``, heard out
  ``confident_guard_ms`` before the audio end, another word after it), or when it is older
  than ``max_tentative_ms`` (bounded latency: commit.voted), or when the voice-activity
  detector shows a pause of ``pause_commit_ms`` after it (the utterance has ended).
* Committed words never change. The window moves up to the commit point once ``trim_after_ms``
  of committed audio built up (``_trim``): an update's cost stays bounded. At ``max_window_ms``
  without a commit, all but the last word are committed and the window is cut there.
* Windows without speech are not decoded; loops meet a token budget (``TOKENS_PER_S``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from subd.history import AudioHistory, HistoryReader
from subd.models.engine import (
    DEFAULT_OPTIONS,
    DEFAULT_POLICY,
    FULL_SPAN,
    WINDOW_SAMPLES,
    EncoderSpan,
    FallbackPolicy,
    WhisperEngine,
    live_threads,
)
from subd.models.words import prompt_of, user_prompt_tokens, with_user_prompt
from subd.recognise import settle
from subd.recognise.commit import decide, unread_from
from subd.recognise.language import LanguageTracker
from subd.recognise.loops import cut_loop, transcribe_unlooped
from subd.recognise.options import StreamingConfig
from subd.recognise.readings import (
    after_commit_point,
    hypothesis_words,
    restated_tail_dropped,
    stacked_tail_cut,
    word_start_at,
)
from subd.recognise.vad import VoiceActivityDetector
from subd.types import (
    SAMPLE_RATE_HZ,
    AudioChunk,
    Hypothesis,
    UpdateCosts,
    Word,
    ns_to_samples,
    samples_to_ns,
)

PROMPT_WORDS = 60  # committed words given as context (≈ 80 tokens)
LEAD_IN_SAMPLES = SAMPLE_RATE_HZ  # audio kept before the commit point when the window moves
STALL_SAMPLES, STALL_LEAD_IN_SAMPLES = SAMPLE_RATE_HZ, SAMPLE_RATE_HZ // 5  # _trim's stall
FINISH_ROUNDS = 2  # decodes after a stream's last one that may read on (finish) ...
FINISH_MIN_PROBABILITY = 0.3  # ... kept where Whisper's mean probability of its words is this
SURE_GUESS = 0.5  # a due guess at a window's edge this sure is committed (_take_due)
GREEDY_POLICY = FallbackPolicy(temperatures=(0.0,))
# A live decode's token budget grows with its window: offline decodes of the LibriVox clips and
# of espeak-ng at 160 words/min take 3.2-4.4 tokens/s with the timestamps. On a cut input Whisper
# can loop a whole sentence (~180 words for 2 s of audio): the budget ends it, its tail is cut.
TOKENS_BASE, TOKENS_PER_S = 20, 10


@dataclass(slots=True)
class _State:
    window_start: int = 0  # sample where the decoded window starts
    committed_end_ns: int = 0  # audio time up to which words are committed
    committed: list[Word] = field(default_factory=list)
    previous: list[Word] = field(default_factory=list)  # last hypothesis after the commit point
    # per word of ``previous``: decodes in a row that heard it out with the same words up to it
    previous_streak: list[int] = field(default_factory=list)
    last_decode_end: int = 0  # audio_end (samples) at the last decode
    settled_end: int = 0  # samples: the hypothesis accounts for all speech before this
    stalled: bool = False  # the last decode left out speech (see _trim)


class StreamingRecognizer:
    def __init__(self, model: str = "tiny.en", *, engine: WhisperEngine | None = None, **opts):
        self.config = StreamingConfig(model=model, **opts)
        c = self.config
        self.engine = engine or WhisperEngine.load(
            c.model, threads=c.threads or live_threads(), quantize=c.precision == "int8"
        )
        self._audio: AudioHistory | HistoryReader | None = None  # see the audio property
        self.vad = VoiceActivityDetector() if c.vad else None
        self.span = EncoderSpan(c.encoder_pad_ms, c.encoder_bucket_ms)
        self.languages = LanguageTracker(c.language, self.engine, span=self.span,
                                         script=c.chinese_script)
        self.state = _State()
        self._user_prompt = user_prompt_tokens(self.engine.tokenizer, c.prompt)
        self.n_decodes = 0
        self.n_capped = 0  # decodes stopped by the window's token budget
        self.n_forced_cuts = 0
        self.deadline_mode = False  # the pipeline gives deadlines (update's commit_until_ns)
        self._finishing = False  # finish() runs: the audio has ended (_heard)

    def set_prompt(self, text: str) -> None:
        """Names and terms to expect from the next decode on (a channel's, changed live)."""
        self._user_prompt = user_prompt_tokens(self.engine.tokenizer, text)

    def read_from(self, reader: HistoryReader) -> None:
        """Read the window in place from the channel's shared audio history (its owner moves
        its end; ``accept`` is unused)."""
        self._audio = reader

    @property
    def audio(self) -> AudioHistory | HistoryReader:
        """Where the window is read from: the shared history (:meth:`read_from`), else a
        private ring that ``accept`` fills (offline transcription, benchmarks)."""
        if self._audio is None:
            self._audio = AudioHistory(WINDOW_SAMPLES + 2 * SAMPLE_RATE_HZ)
        return self._audio

    def accept(self, chunk: AudioChunk) -> None:
        self.audio.write(chunk.start_sample, np.asarray(chunk.samples, dtype=np.float32))

    @property
    def audio_end_ns(self) -> int:
        return samples_to_ns(self.audio.end_sample)

    def start_at(self, sample: int) -> None:
        """Respawned mid-stream: the window never reaches back before ``sample``."""
        st = self.state
        st.window_start = st.last_decode_end = st.settled_end = sample
        st.committed_end_ns = samples_to_ns(sample)

    def measure_update_costs(self) -> UpdateCosts | None:
        """What an update of each span costs on this engine with these options, measured once
        per process on the demo clip (subd.recognise.warmup); this recogniser is not touched."""
        from subd.recognise.warmup import update_costs

        return update_costs(self)

    def update(self, commit_until_ns: int | None = None, full_span: bool = False,
               ending: bool = False, decode: bool = True) -> Hypothesis:
        """Decode the current window if enough new audio arrived; commit what is settled.
        ``commit_until_ns`` (deadline mode, subd.recognise.commit): every word ending by then
        must be committed now, as no later result is in before its deadline. ``full_span``:
        the encoder runs over Whisper's whole input, not the window plus ``encoder_pad_ms``
        (subd.pipeline.deadline). ``ending``: the last update before ``finish`` (_take_due).
        ``decode=False``: degraded (subd.service.batching), no decode however much is new."""
        c, st = self.config, self.state
        end = self.audio.end_sample
        if not decode or end - st.last_decode_end < c.min_update_ms * SAMPLE_RATE_HZ // 1000:
            # no new decode: words now due are taken from the last hypothesis
            due = [] if commit_until_ns is None else self._take_due(commit_until_ns, ending)
            return self._hypothesis(due)
        st.last_decode_end = end
        st.window_start = max(st.window_start, end - WINDOW_SAMPLES, self.audio.start_sample)
        window = self.audio.read(st.window_start, end)
        if self.vad is not None and not self._has_speech(st.window_start, end):
            return self._on_silence(end)
        if self.languages.resolve(window, self.vad) is None:
            return self._hypothesis([])  # "auto": more speech before the language is named
        self.deadline_mode |= commit_until_ns is not None
        # driven alone, the full input until the first commit (the cut span lost "And" of "And Mr.")
        full_span |= not self.deadline_mode and not st.committed
        words = self._decode(window, FULL_SPAN if full_span else None)
        if not words and st.previous and commit_until_ns is not None:
            # nothing read where the last decode read words ("and Mr.", nothing twice, then "Mr.
            # John" lost "And"): due words from the last reading; a stall moves the window on
            return self._hypothesis(self._take_due(commit_until_ns) + self._trim(
                end, full_span, True, self.config.deadline_pause_commit))
        unread = self._unread_tail(words) if commit_until_ns is not None else []
        newly = self._commit(words, end, commit_until_ns)
        if unread:
            st.previous += [w for w, _ in unread]
            st.previous_streak += [s for _, s in unread]
            newly += self._take_due(commit_until_ns)
        newly += self._trim(end, full_span, not words, pause_commit=commit_until_ns is None
                            or self.config.deadline_pause_commit)
        self._settle(end)
        return self._hypothesis(newly)

    def finish(self) -> Hypothesis:
        """End of stream: decode what is left once more and commit everything."""
        self._finishing = True
        st = self.state
        end = self.audio.end_sample
        newly: list[Word] = []
        if end > st.window_start:
            window = self.audio.read(st.window_start, end)
            if self.vad is None or self._has_speech(st.window_start, end):
                # Whisper's full 30 s input: this decode commits without a second opinion, and
                # a cut window invents words at a stream's end ("... comments tonight. And")
                self.languages.resolve(window, None)  # "auto" and too little speech: name it now
                newly = self._take(self._decode(window, FULL_SPAN))
                # Whisper may end a decode at a segment with speech after it (offline reads on
                # in its next window): "an esclavine of leather" was lost after "over his
                # shoulders and". Decode on while that adds words and speech is left after them.
                for _ in range(FINISH_ROUNDS):
                    if not newly or (self.vad is not None and settle.speech_onset(
                            self.vad, self.audio, self._commit_sample(), end) is None):
                        break
                    more = self._decode(window, FULL_SPAN)
                    # a second reading, so only a sure one: on a breath after "movable
                    # types." it read "A" (probability 0.00)
                    if not more or np.mean([w.probability for w in more]) < FINISH_MIN_PROBABILITY:
                        break
                    newly += self._take(more)
        # the last hypothesis's words after the final decode's: heard out, sure, not its end again
        left = restated_tail_dropped(
            [w for w in st.previous if w.start_ns >= st.committed_end_ns
             and w.probability >= FINISH_MIN_PROBABILITY], st.committed)
        newly += self._take(self._heard(left))
        st.previous = []
        st.settled_end = end
        return Hypothesis(committed=tuple(newly), tentative=(), audio_end_ns=samples_to_ns(end))

    def _has_speech(self, first: int, end: int) -> bool:
        """Speech in samples [first, end)? (each frame analysed once: subd.recognise.settle)"""
        return settle.has_speech(self.vad, self.audio, first, end)

    def _decode(self, window: np.ndarray, span: EncoderSpan | None = None) -> list[Word]:
        st = self.state
        # prompt: the user's, then committed words starting before the window (its own words
        # make Whisper skip them), the one it cuts too ("ill-disposed. had he married a ...")
        window_start_ns = samples_to_ns(st.window_start)
        before = [w for w in st.committed[-PROMPT_WORDS:] if w.start_ns < window_start_ns]
        prompt = with_user_prompt(self._user_prompt, before and self.engine.tokenizer.encode(
            prompt_of(before)))
        # words committed inside the window are forced as a prefix: only the tail is decoded
        inside = [w for w in st.committed if w.start_ns >= window_start_ns]
        prefix: tuple[int, ...] = ()
        if inside and self.languages.policy(self.config).force_committed_prefix:  # CJK: no
            tok = self.engine.tokenizer
            text = tok.encode(prompt_of(inside))
            prefix = (tok.special.timestamp_begin, *text)
        # after a stall (_trim) it may fall back, as offline (CJK deadline mode: fallback_for)
        policy = self.languages.fallback(
            DEFAULT_POLICY if self.config.temperature_fallback or st.stalled else GREEDY_POLICY,
            self.deadline_mode, self._speech_after_commit_point)
        budget = TOKENS_BASE + TOKENS_PER_S * len(window) // SAMPLE_RATE_HZ - len(prefix)
        options = replace(DEFAULT_OPTIONS, max_new_tokens=max(TOKENS_BASE, budget),
                          continue_prefix=bool(prefix) and self._speech_after_commit_point())
        result = transcribe_unlooped(
            self.engine, window, prompt, policy, inside if prefix else (), options=options,
            prefix=prefix,
            retry_without_prefix=self._speech_after_commit_point,  # asked only if needed
            span=span or self.span, language=self.languages.language,
        )
        self.n_decodes += 1
        self.n_capped += result.decode.capped
        offset_ns = samples_to_ns(st.window_start)
        words = self.languages.written(hypothesis_words(result.words, offset_ns))
        if self.deadline_mode:  # looped copies cut; words on silence dropped or ended (settle)
            words = settle.overruns_cut(self.vad, self.audio, self._heard(stacked_tail_cut(
                words, offset_ns + samples_to_ns(len(window)))), self._commit_sample())
        return self._after_commit_point(cut_loop(words), forced=result.prefix_used)

    def _heard(self, words: list[Word]) -> list[Word]:
        """Deadline mode: the words with speech under them, those heard out (settle.heard);
        in ``finish``, every word (the audio has ended)."""
        return words if self.vad is None or not self.deadline_mode else settle.heard(
            self.vad, self.audio, words, self.state.window_start, self.audio.end_sample,
            stream_end=self._finishing)

    def _commit_sample(self) -> int:
        """The first sample of the window after the committed words."""
        return max(ns_to_samples(self.state.committed_end_ns), self.state.window_start)

    def _speech_after_commit_point(self) -> bool:
        """Is there speech after the committed words (something left to transcribe)?"""
        return self.vad is None or self._has_speech(self._commit_sample(), self.audio.end_sample)

    def _after_commit_point(self, words: list[Word], forced: bool = False) -> list[Word]:
        """Drop hypothesis words that re-state committed audio (subd.recognise.commit)."""
        st = self.state
        return after_commit_point(words, st.committed, st.committed_end_ns, forced,
                                  deadline=self.deadline_mode)

    def _commit(self, words: list[Word], end: int, commit_until_ns: int | None) -> list[Word]:
        st = self.state
        window_ms = (end - st.window_start) * 1000 // SAMPLE_RATE_HZ
        d = decide(self.languages.policy(self.config, self.deadline_mode), words, st.previous,
                   st.previous_streak, samples_to_ns(end), window_ms, commit_until_ns,
                   bool(st.committed))
        self.n_forced_cuts += d.forced_cut
        newly = self._take(list(d.words))
        st.previous = words[d.n_commit:]
        st.previous_streak = list(d.streak[d.n_commit:])
        if window_ms >= self.config.max_window_ms and not newly and not st.previous:
            st.window_start = end - 2 * SAMPLE_RATE_HZ  # no words at all: keep 2 s of context
        return newly

    def _unread_tail(self, words: list[Word]) -> list[tuple[Word, int]]:
        """Deadline mode: the last hypothesis's words after a decode that stopped short of
        them, with their streaks (commit.unread_from), judged again on the audio there is now
        (a word written over a breath: settle.heard)."""
        st = self.state
        n = unread_from(words, st.previous)
        heard = {id(w) for w in self._heard(st.previous[n:])}
        return [(w, s) for w, s in zip(st.previous[n:], st.previous_streak[n:], strict=True)
                if id(w) in heard]

    def _take_due(self, commit_until_ns: int, ending: bool = False) -> list[Word]:
        """Commit the due words of the last hypothesis, but not a guess at a window's edge (not
        heard out by its decode: streak 0): unsure, it is dropped for the next decode that reads
        its audio; ``ending``, any waits for the final decode (``finish`` keeps one that leaves
        it out). MEASUREMENTS, "A guess at a window's edge"."""
        st, n = self.state, 0
        while n < len(st.previous) and st.previous[n].end_ns <= commit_until_ns:
            n += 1
        k = next((i for i in range(n) if st.previous_streak[i] == 0
                  and (ending or st.previous[i].probability < SURE_GUESS)), n)
        newly = self._take(st.previous[:k])
        kept = k if ending else n  # the first guess on: kept for the final decode, or dropped
        st.previous, st.previous_streak = st.previous[kept:], st.previous_streak[kept:]
        return newly

    def _take(self, words: list[Word]) -> list[Word]:
        """Commit ``words`` (monotonic in time, never before the commit point)."""
        st = self.state
        out = []
        for w in words:
            inside = w.start_ns < st.committed_end_ns or not self.deadline_mode
            if w.end_ns <= st.committed_end_ns and inside and st.committed:
                continue  # in committed audio (deadline mode: no duration at its end is new)
            start = max(w.start_ns, st.committed_end_ns)
            out.append(replace(w, start_ns=start, end_ns=max(start, w.end_ns)))
            st.committed.append(out[-1])
            st.committed_end_ns = out[-1].end_ns
        if len(st.committed) > 4 * PROMPT_WORDS:
            del st.committed[:-PROMPT_WORDS]
        return out

    def _on_silence(self, end: int) -> Hypothesis:
        """No speech in the window: the tentative tail is final; skip the silence."""
        st = self.state
        newly = self._take(st.previous)
        st.previous, st.previous_streak = [], []  # both (a stale streak broke _unread_tail)
        commit = ns_to_samples(st.committed_end_ns) - LEAD_IN_SAMPLES
        st.window_start = max(st.window_start, min(end - LEAD_IN_SAMPLES, commit))
        st.settled_end = end
        return self._hypothesis(newly)

    def _trim(self, end: int, full_span: bool = False, no_words: bool = False,
              pause_commit: bool = True) -> list[Word]:
        """Move the window start up to the commit point (a free decode, which reads from the
        window's first sample: to the start of an utterance); commit the tail at a pause (not
        in deadline mode: a speaker who pauses may go on). A decode that left out speech heard
        out for ``STALL_SAMPLES`` after the commit point moves it there at once, as offline
        Whisper seeks to where its transcript stopped, keeping ``STALL_LEAD_IN_SAMPLES`` (with
        the sentence Whisper had closed, it stopped after it again); the next decode may fall
        back to higher temperatures (greedy, tiny.en read dev's AMI clip as "year.", lost it)."""
        c, st = self.config, self.state
        p = self.languages.policy(c, self.deadline_mode)
        commit_sample = ns_to_samples(st.committed_end_ns)
        keep_ms = c.full_span_trim_after_ms if full_span else c.trim_after_ms
        after = max(commit_sample, st.window_start)
        st.stalled = no_words and self.vad is not None and after < end - STALL_SAMPLES and \
            self._has_speech(after, end - STALL_SAMPLES)
        lead_in, keep_ms = (STALL_LEAD_IN_SAMPLES, 0) if st.stalled else (LEAD_IN_SAMPLES, keep_ms)
        if commit_sample - st.window_start >= keep_ms * SAMPLE_RATE_HZ // 1000:
            # a second before the commit point (a cut at a word boundary, ±100 ms, clips the next
            # onset; re-read words are dropped); after a stall not inside a word: forced whole
            at = min(commit_sample, end) - lead_in
            whole = st.stalled and p.force_committed_prefix  # not CJK: zh-dev 35 -> 39 wrong
            at = max(st.window_start, word_start_at(st.committed, at) if whole else at)
            st.window_start = at if p.force_committed_prefix or self.vad is None or st.stalled \
                else settle.utterance_start(self.vad, self.audio, st.window_start, at)
        if pause_commit and self.vad is not None and st.previous:
            n = settle.utterance_end(self.vad, self.audio, st.previous, st.window_start, end,
                                     p.pause_commit_ms, p.pause_context_ms)
            newly = self._take(st.previous[:n])
            st.previous, st.previous_streak = st.previous[n:], st.previous_streak[n:]
            return newly
        return []

    def _settle(self, end: int) -> None:
        """How far the hypothesis accounts for all speech (subd.recognise.settle). In deadline
        mode it may move back: a decode that stopped short of the last one's words accounts for
        less of the audio (kept from the last decode, the speech after its last word read as a
        pause, and the tagger ended a sentence there: "of a. Table round", "ride a. Mane").
        Driven alone it only moves on, as measured there (subd bench punct-e2e)."""
        st = self.state
        last = st.previous[-1] if st.previous else (st.committed[-1] if st.committed else None)
        last_end = None if last is None else ns_to_samples(last.end_ns)
        settled = settle.settled_end(self.vad, self.audio, st.window_start, last_end, end)
        st.settled_end = settled if self.deadline_mode else max(st.settled_end, settled)

    def _hypothesis(self, newly: list[Word]) -> Hypothesis:
        """``audio_end_ns`` is the settled end (see ``_settle``), not the audio received."""
        return Hypothesis(
            committed=tuple(newly),
            tentative=tuple(self.state.previous),
            audio_end_ns=samples_to_ns(self.state.settled_end),
        )
