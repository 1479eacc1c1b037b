"""Streaming punctuation: decide each word's mark and case once its right context is enough.

At every look-ahead fetch the tag stage hands over the words the recogniser newly committed and
its current tentative tail. Committed words wait ("pending") until either
``right_context_words`` words (committed or tentative) follow them, or a pause of at least
``pause_commit_ms`` follows them before the next word. After the last word recognised so far the
gap to the end of the audio is only trusted as silence from ``trailing_pause_commit_ms`` on
(shorter, it is unknown to the tagger too): a streaming recogniser often has not transcribed the
next word yet, and its "settled" audio end is then wrong. Then their punctuation and case become
final and are never changed again: the words after them are decoded with the final words
pinned, so a later, better-informed window can never contradict what was already shown.
Tentative words are only ever right context.

The recogniser's own marks ("them." / "man,") go to the tagger as evidence, together with how
many words the recogniser had decoded after each word in the hypothesis that committed it (0 =
the word ended its decoded window: the place where its sentence ends are least reliable). That
count is exact when ``update`` is called once per recogniser hypothesis; when several
hypotheses' committed words arrive in one call, the words of earlier ones look better covered
than they were. Chunk-edge rule: a full stop on such a window-edge word ends the sentence only
with a pause of ``pause_commit_ms`` after it, or if the tagger still ends the sentence there
with that mark set aside (the words after it say so); Whisper closes almost every decode with
a full stop, so that mark alone is no evidence. A question or exclamation mark there stays
evidence: Whisper writes one only where the words read so ("what do you think?").

Work per update is bounded: the tagger sees at most ``left_context_words`` final words, the
pending words (at most ``max_pending_words``; beyond that the oldest are decided anyway) and
the tentative tail.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from subd.errors import ConfigError
from subd.models.punct import (
    SENTENCE_END,
    PunctTagger,
    RecogniserMark,
    WordTag,
    pauses_ms_of,
    recogniser_mark,
    tagged_word,
)
from subd.models.punct.features import pause_buckets
from subd.types import Hypothesis, TaggedWord, Word

NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class PunctConfig:
    """Section ``[punct]``: when a word's punctuation is decided."""

    right_context_words: int = 3
    pause_commit_ms: float = 350.0
    trailing_pause_commit_ms: float = 1200.0
    left_context_words: int = 16
    max_pending_words: int = 48
    recogniser_marks: bool = True  # weigh the recogniser's own marks (False: words only)
    # Deadline mode: a word the recogniser wrote with at least this many words decoded after
    # it keeps the recogniser's own mark and case (Whisper decided them with right context);
    # the tagger decides the others, the window-edge words among them. 0: the tagger decides.
    # At 2 (one core's updates, D = 2 s) Whisper's full stop at a pause with "Nor of" after it
    # stood ("antecedents. Nor of the circumstances"), which the tagger reads as a comma.
    # subd bench quality --pace cpu, dev set, 2 -> 4: each clip its own stream (--per-clip
    # --update-ms 450,140) D = 2 s '.' / ',' F1 0.75 / 0.37 -> 0.78 / 0.47, full stops inside
    # sentences 4 -> 3, D = 0.5, 1, 4, 10 s unchanged (0: D = 4 s 0.91 / 0.67 too); joined
    # clips unchanged at D = 1, 2, 4 s. With a GPU's updates (--update-ms 60,30) Whisper hears
    # more after each word: 4 keeps its marks there as 2 did (D = 2 s 0.82 / 0.53), 0 and 6
    # do not (0.76 / 0.50).
    trust_recogniser_after_words: int = 4
    # ... but where it wrote no mark, the tagger's comma stands: Whisper leaves commas out far
    # more often than it misplaces one, and its full stops and capitals stay as it wrote them.
    # subd bench quality --pace cpu --update-ms 450,140 --synthetic, D = 2 s: ',' F1 dev
    # 0.40 -> 0.67 ("antecedents, nor"; offline 0.67); held-out 0.50 and espeak-ng 0.67 at
    # D = 1, 2, 4 s unchanged, every other figure equal
    tagger_commas: bool = True
    # Deadline mode: where Whisper weighed a comma after a word at least ``comma_weight`` and
    # a full stop under ``sure_stop`` (less than even odds), the word gets a comma, whatever
    # Whisper wrote there ("." or nothing; Word.mark_p). Decided with the ~1.5 s of audio
    # after it that D = 2 s leaves, Whisper writes a full stop where, with 3 s, it writes a
    # comma ("feats of strength, round his"), and leaves a comma out that it already weighs.
    # subd bench quality --sets dev --per-clip --pace cpu --update-ms 300,170, D = 2 s:
    # '.' / ',' F1 0.86 / 0.52 -> 0.94 / 0.65 (offline 0.89 / 0.60), chosen there; 0: off
    comma_weight: float = 0.2
    sure_stop: float = 0.5

    def __post_init__(self) -> None:
        _check("right_context_words", self.right_context_words, 1, 32)
        _check("pause_commit_ms", self.pause_commit_ms, 50.0, 5000.0)
        _check("trailing_pause_commit_ms", self.trailing_pause_commit_ms, 50.0, 10000.0)
        _check("left_context_words", self.left_context_words, 1, 256)
        _check("max_pending_words", self.max_pending_words, self.right_context_words + 1, 512)
        _check("trust_recogniser_after_words", self.trust_recogniser_after_words, 0, 64)
        _check("comma_weight", self.comma_weight, 0.0, 1.0)
        _check("sure_stop", self.sure_stop, 0.0, 1.0)
        for key in ("recogniser_marks", "tagger_commas"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(
                    f"[punct] {key} must be true or false, got {getattr(self, key)!r}")


def edge_mark_set_aside(punct: str, mark: RecogniserMark, pause_ms: float | None,
                        min_pause_ms: float) -> bool:
    """The chunk-edge rule's test, for English and CJK marks alike: ``punct`` (the tag of the
    recogniser's mark) is a full stop on the last word of its decoded window, with no pause of
    ``min_pause_ms`` after it. Whisper closes a decode with a full stop whatever was said; a
    question or exclamation mark there is evidence ("what do you think?", tests/test_punct_e2e)."""
    return punct == "." and mark.n_after == 0 and (pause_ms is None or pause_ms < min_pause_ms)


def comma_weighed(mark: RecogniserMark, comma_weight: float, sure_stop: float) -> bool:
    """Whisper wrote a full stop it was unsure of, or no mark, where it weighed a comma at
    ``comma_weight`` or more (``PunctConfig.comma_weight``)."""
    if not comma_weight or mark.probs is None or mark.punct not in ("", "."):
        return False
    stop, comma = mark.probs
    return comma >= comma_weight and stop < sure_stop


def _check(key: str, value: float, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ConfigError(f"[punct] {key} must be in {lo}..{hi}, got {value!r}")


@dataclass(frozen=True, slots=True)
class PunctUpdate:
    """``final``: words decided by this update (final=True), in order, each exactly once.
    ``provisional``: the undecided committed words then the tentative tail (final=False)."""

    final: tuple[TaggedWord, ...]
    provisional: tuple[TaggedWord, ...]


class PunctStream:
    def __init__(self, tagger: PunctTagger, config: PunctConfig | None = None) -> None:
        self.tagger = tagger
        self.config = config or PunctConfig()
        self._left: deque[tuple[TaggedWord, RecogniserMark]] = deque(
            maxlen=self.config.left_context_words)
        self._pending: list[Word] = []
        self._pending_marks: list[RecogniserMark] = []
        self._n_final = 0
        self._last_end_ns = -1
        self._memo_key: tuple | None = None
        self._memo_tags: list[WordTag] = []
        self._memo_edge: tuple[tuple | None, list[WordTag]] = (None, [])
        self.n_edge_marks_set_aside = 0  # window-edge sentence ends the rule turned down

    @property
    def n_final(self) -> int:
        return self._n_final

    @property
    def n_pending(self) -> int:
        return len(self._pending)

    def update_from(self, hypothesis: Hypothesis) -> PunctUpdate:
        return self.update(hypothesis.committed, hypothesis.tentative, hypothesis.audio_end_ns)

    def update(
        self, committed: Sequence[Word], tentative: Sequence[Word], audio_end_ns: int,
        decide_until_ns: int | None = None,
    ) -> PunctUpdate:
        """Add newly committed words; decide those with enough right context, or, given
        ``decide_until_ns`` (deadline mode: the pipeline's tick), exactly those that end by
        then: a word is decided at its tick's look-ahead fetch, with all the right context
        there is by then, and never earlier."""
        self._take(committed, len(committed) + len(tentative))
        # A tentative word re-states committed audio only if it lies mostly inside it: word
        # times move by 100-200 ms between decodes, and dropping a word that merely starts a
        # little early would leave a gap that reads as a pause (a false sentence end).
        tail = [w for w in tentative if w.start_ns + w.end_ns > 2 * self._last_end_ns]
        last = tail[-1] if tail else (self._pending[-1] if self._pending else None)
        trailing_ns = self.config.trailing_pause_commit_ms * NS_PER_MS
        # The gap after the last word recognised so far is a pause only when it is long: in a
        # stream, audio the recogniser has not transcribed yet looks just like silence (on the
        # espeak-ng streams of subd bench punct-e2e, 2 of 3 such gaps over 350 ms held a word).
        heard_silence = last is not None and audio_end_ns - last.end_ns >= trailing_ns
        # At a deadline the words must be decided now: the recogniser's settled end (no
        # speech before it, by the VAD) is the best there is of the pause after the last word.
        after_last_ns = audio_end_ns if heard_silence or decide_until_ns is not None else None
        if decide_until_ns is None:
            n_decide = self._n_ready(tail, after_last_ns)
        else:
            n_decide = 0
            while n_decide < len(self._pending) and \
                    self._pending[n_decide].end_ns <= decide_until_ns:
                n_decide += 1
            n_decide = max(n_decide, len(self._pending) - self.config.max_pending_words)
        return self._decide(tail, after_last_ns, n_decide, complete=False,
                            deadline=decide_until_ns is not None)

    def flush(self, audio_end_ns: int | None = None, committed: Sequence[Word] = ()
              ) -> PunctUpdate:
        """End of stream: take the last ``committed`` words (nothing decoded after them) and
        decide every pending word, knowing the last one ends the stream. (Decided first as
        due words, a stream's last word was a window edge and lost its full stop.)"""
        self._take(committed, len(committed))
        return self._decide([], audio_end_ns, len(self._pending), complete=True)

    def _take(self, committed: Sequence[Word], n_decoded: int) -> None:
        """Newly committed words join the pending ones, each with the recogniser's mark and
        how many words it decoded after it (``n_decoded``: the hypothesis's words, in order)."""
        for w in committed:
            if w.start_ns < self._last_end_ns - 1_000_000_000:
                raise ValueError(f"committed word {w.text!r} starts long before the previous one")
            self._last_end_ns = max(self._last_end_ns, w.end_ns)
        self._pending.extend(committed)
        self._pending_marks += [recogniser_mark(w.text, n_decoded - 1 - i, w.mark_p)
                                for i, w in enumerate(committed)]

    def _n_ready(self, tail: Sequence[Word], after_last_ns: int | None) -> int:
        """How many pending words (a prefix) have enough right context now: words or a pause
        after them (for the last word, a long trailing silence, ``after_last_ns``)."""
        cfg = self.config
        pending = self._pending
        following = [*pending, *tail]
        n_ready = max(0, len(following) - cfg.right_context_words)
        n_ready = min(n_ready, len(pending))
        pause_ns = cfg.pause_commit_ms * NS_PER_MS
        for i in range(len(pending) - 1, n_ready - 1, -1):
            nxt = following[i + 1].start_ns if i + 1 < len(following) else after_last_ns
            if nxt is not None and nxt - pending[i].end_ns >= pause_ns:
                n_ready = i + 1
                break
        return max(n_ready, len(pending) - cfg.max_pending_words)

    def _decide(
        self, tail: Sequence[Word], audio_end_ns: int | None, n_decide: int, complete: bool,
        deadline: bool = False,
    ) -> PunctUpdate:
        if not self._pending and not tail:
            return PunctUpdate((), ())
        left = [t for t, _ in self._left]
        window = [t.word for t in left] + self._pending + list(tail)
        marks: list[RecogniserMark] | None = None
        if self.config.recogniser_marks:
            marks = [m for _, m in self._left] + self._pending_marks
            marks += [recogniser_mark(w.text, len(tail) - 1 - i, w.mark_p)
                      for i, w in enumerate(tail)]
        pauses = pauses_ms_of(window, audio_end_ns)
        commas = self._weighed_commas(marks, len(left)) if deadline else set()
        # The tag stage may run at every tick; re-tag only when the input changed. A tail word
        # compares by text and times, not by what Whisper weighed (Word.mark_p): the next
        # decode may read the same words at the same times and weigh their marks anew.
        key = (self._n_final, len(self._pending), tuple(tail), tuple(w.mark_p for w in tail),
               complete, int(pause_buckets(pauses[-1:], 1)[0]), deadline)
        if key != self._memo_key:
            fixed = self._fixed(len(window), commas)
            self._memo_tags = self.tagger.tag(
                [w.text for w in window], pauses, right_context_complete=complete,
                fixed=fixed, stream_start=self._n_final == 0, recogniser=marks,
            )[len(left):]
            self._memo_key = key
        tags = self._memo_tags
        if marks is not None and not complete:
            if self._memo_edge[0] != (key, n_decide):
                checked = self._edge_checked(window, pauses, marks, len(left), n_decide, tags,
                                             commas)
                self._memo_edge = ((key, n_decide), checked)
            tags = self._memo_edge[1]
        k_trust = self.config.trust_recogniser_after_words
        if k_trust and deadline and marks is not None:
            own, tags = tags, list(tags)
            trusted = []
            for i in range(min(n_decide, len(tags))):
                mark = marks[len(left) + i]
                if mark.n_after is not None and mark.n_after >= k_trust:
                    punct = "," if len(left) + i in commas else mark.punct
                    if not punct and self.config.tagger_commas and tags[i].punct == ",":
                        punct = ","
                    tags[i] = WordTag(punct, mark.case, tags[i].break_after)
                    trusted.append(i)
            tags = self._sentence_case(tags, own, trusted, marks, len(left))
        decided = zip(self._pending[:n_decide], tags, strict=False)
        final = tuple(tagged_word(w, t, True) for w, t in decided)
        rest = list(zip([*self._pending[n_decide:], *tail], tags[n_decide:], strict=True))
        provisional = tuple(tagged_word(w, t, False) for w, t in rest)
        self._left.extend(zip(final, self._pending_marks[:n_decide], strict=True))
        self._pending = self._pending[n_decide:]
        self._pending_marks = self._pending_marks[n_decide:]
        self._n_final += len(final)
        return PunctUpdate(final, provisional)

    def _weighed_commas(self, marks: list[RecogniserMark] | None, n_left: int) -> set[int]:
        """Window positions after the decided words whose comma Whisper weighed
        (``comma_weighed``): the tagger is held to a comma there, its case and the words after
        it free to fit."""
        cfg = self.config
        if marks is None or not cfg.comma_weight:
            return set()
        return {k for k in range(n_left, len(marks))
                if comma_weighed(marks[k], cfg.comma_weight, cfg.sure_stop)}

    def _fixed(self, n: int, commas: set[int]) -> list[tuple[str, str | None] | None]:
        """The tagger's pins: the decided words' tags, and a comma where Whisper weighed one."""
        fixed: list[tuple[str, str | None] | None] = [(t.punct, t.case) for t, _ in self._left]
        fixed += [(",", None) if k in commas else None for k in range(len(fixed), n)]
        return fixed

    def _sentence_case(self, tags: list[WordTag], own: Sequence[WordTag], trusted: list[int],
                       marks: list[RecogniserMark], n_left: int) -> list[WordTag]:
        """The recogniser's case where its mark was trusted, made to agree with the marks
        decided before it: a word after a sentence end (or a stream's first word) starts with
        a capital, which Whisper leaves out where it read its first second of audio alone
        ("printing in the only sense"); and where Whisper capitalised a word only because it
        ended a sentence before it that the decided mark does not end ("antecedents, Nor"),
        the tagger's own case stands."""
        for i in trusted:
            if i:
                before = tags[i - 1].punct
            elif self._left:
                before = self._left[-1][0].punct
            else:
                before = "." if self._n_final == 0 else ""
            tag, k = tags[i], n_left + i
            case = tag.case
            if before in SENTENCE_END and case == "lower":
                case = "cap"
            elif (before not in SENTENCE_END and case == "cap" and k
                  and marks[k - 1].punct in SENTENCE_END):
                case = own[i].case
            if case != tag.case:
                tags[i] = WordTag(tag.punct, case, tag.break_after)
        return tags

    def _edge_checked(
        self, window: list[Word], pauses: list[float | None], marks: list[RecogniserMark],
        n_left: int, n_decide: int, tags: list[WordTag], commas: set[int],
    ) -> list[WordTag]:
        """Chunk-edge rule: a word the recogniser wrote with a full stop at the very end of
        its decoded window (nothing decoded after it) may end a sentence on that mark only with
        a real pause after it, or if the words alone still end the sentence there; otherwise
        the mark is set aside (a window edge is where Whisper writes a full stop whatever was
        said; ``edge_mark_set_aside``)."""
        pause_ms = self.config.pause_commit_ms
        suspect = []
        for i in range(n_decide):
            k = n_left + i
            mark, pause = marks[k], pauses[k]
            if tags[i].punct in SENTENCE_END and edge_mark_set_aside(mark.punct, mark, pause,
                                                                     pause_ms):
                suspect.append(k)
        if not suspect:
            return tags
        hidden: list[RecogniserMark | None] = list(marks)
        for k in suspect:
            hidden[k] = None
        alt = self.tagger.tag([w.text for w in window], pauses, right_context_complete=False,
                              fixed=self._fixed(len(window), commas),
                              stream_start=self._n_final == 0, recogniser=hidden)[n_left:]
        self.n_edge_marks_set_aside += sum(alt[k - n_left].punct not in SENTENCE_END
                                           for k in suspect)
        return alt
